"""``--return-routed-experts`` with SGLang (:mod:`plasmid_sglang.routing`): the request asks for
the routing, launched servers get ``--enable-return-routed-experts``, and ``meta_info["routed_experts"]``
(base64 int32 ``[tokens, num_hidden_layers, top_k]``, as SGLang 0.5.23's tokenizer manager encodes
it) becomes the sample format, one entry per MoE layer; a continued response reports the last
request's routing, which covers the whole sequence.

No server: SGLang 0.5.23 cannot serve an MoE model with routing capture on a CPU (its host buffer
for the captured routes is pinned with ``cudaHostRegister``, and its Qwen2-MoE/Qwen3-MoE layers run
Triton kernels: ``fused_gate_sigmoid_mul_add``, fused MoE), so the answers here are built the way
SGLang builds them, and decoded with SGLang's own decoder too where it is installed.
"""

from __future__ import annotations

import base64
import json
from types import SimpleNamespace

import numpy as np
import plasmid_sglang.engine
import plasmid_sglang.plugin
import pytest
from plasmid_sglang.engine import SGLangEngine
from plasmid_sglang.requests import generate_request, parse_generate
from plasmid_sglang.routing import RoutingLayout
from sglang_test_support import sglang_installed

from plasmid import testing
from plasmid.errors import UsageError
from plasmid.types import SamplingParams, Status
from plasmid_serving.engine import Ticket
from plasmid_torch.tiny import build_tiny_model

needs_sglang = pytest.mark.skipif(not sglang_installed(), reason="SGLang is not installed")


def encoded(routes: np.ndarray) -> str:
    """``routes`` as SGLang sends them (tokenizer_manager: ``b64encode(tensor.numpy().tobytes())``)."""
    return base64.b64encode(np.ascontiguousarray(routes, dtype=np.int32).tobytes()).decode("utf-8")


@pytest.fixture(scope="module")
def sparse_step_moe(tmp_path_factory):
    """A tiny Qwen2-MoE whose layers 0 and 2 are dense (``decoder_sparse_step`` 2): SGLang still
    reports a row for each of the 3 layers."""
    return build_tiny_model(tmp_path_factory.mktemp("moe") / "m", arch="qwen2_moe", decoder_sparse_step=2,
                            num_layers=3)


def test_the_layout_keeps_the_sparse_layers_and_a_dense_model_is_refused(sparse_step_moe, tmp_path):
    assert RoutingLayout.of_model(str(sparse_step_moe)) == RoutingLayout(num_layers=3, top_k=2, moe_layers=(1,))
    every = build_tiny_model(tmp_path / "qwen3", arch="qwen3_moe")
    assert RoutingLayout.of_model(str(every)).moe_layers == (0, 1)
    with pytest.raises(UsageError, match=r"--return-routed-experts: the model at .*dense has no mixture-of-experts"):
        RoutingLayout.of_model(str(build_tiny_model(tmp_path / "dense")))


def test_decode_gives_one_entry_per_token_and_moe_layer(sparse_step_moe):
    layout = RoutingLayout.of_model(str(sparse_step_moe))
    routes = np.random.default_rng(0).integers(0, 4, size=(7, 3, 2))
    decoded = layout.decode(encoded(routes), tokens=7)
    assert decoded == routes[:, [1]].tolist() and np.array(decoded).shape == (7, 1, 2)
    with pytest.raises(ValueError, match=r"holds 42 int32 values; expected 8 tokens x 3 layers x top-2 = 48"):
        layout.decode(encoded(routes), tokens=8)
    with pytest.raises(ValueError, match=r"without meta_info\['routed_experts'\]: .*--sglang-enable-return-routed"):
        layout.decode(None, tokens=7)
    with pytest.raises(ValueError, match="is not base64"):
        layout.decode("not base64!", tokens=7)


@needs_sglang
def test_decode_agrees_with_sglangs_own_decoder(sparse_step_moe):
    from sglang.srt.state_capturer.routed_experts import extract_routed_experts_from_meta_info

    routes = np.random.default_rng(1).integers(0, 4, size=(5, 3, 2))
    theirs = extract_routed_experts_from_meta_info({"meta_info": {"routed_experts": encoded(routes)}})
    ours = RoutingLayout.of_model(str(sparse_step_moe)).decode(encoded(routes), tokens=5)
    assert ours == theirs.reshape(5, 3, 2)[:, [1]].tolist()


def test_the_request_asks_for_routing_only_when_told():
    params = SamplingParams(max_new_tokens=4)
    assert "return_routed_experts" not in generate_request([1, 2], params, 4)
    assert generate_request([1, 2], params, 4, routed_experts=True)["return_routed_experts"] is True
    answer = {"output_ids": [5], "meta_info": {"finish_reason": {"type": "length"},
                                                "output_token_logprobs": [[-0.1, 5, None]], "routed_experts": "AAAA"}}
    assert parse_generate(answer).routed_experts == "AAAA"


def test_a_continued_response_reports_the_last_requests_routing(sparse_step_moe, monkeypatch):
    """SGLang ends the first request on an end-of-sequence id (7) the request did not ask to stop on;
    the engine continues with prompt + response so far, and that second answer's routing (the
    whole sequence but the last token) is the response's."""
    layout = RoutingLayout.of_model(str(sparse_step_moe))
    prompt, first, second = [1, 5, 6], [8, 7], [9, 4]
    full = np.random.default_rng(2).integers(0, 4, size=(len(prompt + first + second) - 1, 3, 2))
    bodies = []

    async def fake_request(url, path, body, timeout=None):
        bodies.append(body)
        context = len(body["input_ids"])
        output = first if len(bodies) == 1 else second
        finish = {"type": "stop", "matched": 7} if len(bodies) == 1 else {"type": "length"}
        meta = {"finish_reason": finish, "weight_version": "3",
                "output_token_logprobs": [[-0.5, t, None] for t in output],
                "routed_experts": encoded(full[:context + len(output) - 1])}
        return 200, json.dumps({"output_ids": output, "meta_info": meta})

    monkeypatch.setattr(plasmid_sglang.engine, "request", fake_request)
    engine = SGLangEngine.__new__(SGLangEngine)         # no servers: only the request loop runs
    engine.routing, engine.router, engine.request_timeout = layout, None, 10.0
    engine._weight_version, engine._stats = 0, {"continuations": 0}
    server = SimpleNamespace(url="http://fake", name="fake")
    ticket = Ticket()
    output = testing.run(engine._generate_on(server, ticket, prompt, SamplingParams(max_new_tokens=4)))
    assert [body["return_routed_experts"] for body in bodies] == [True, True]
    assert output.token_ids == first + second and output.status is Status.TRUNCATED
    assert output.routed_experts == full[:, [1]].tolist()
    assert len(output.routed_experts) == len(prompt) + len(output.token_ids) - 1


@needs_sglang
def test_launched_servers_capture_routing_when_asked(sparse_step_moe):
    from plasmid_sglang.server import server_fields

    asked = testing.make_config(plasmid_sglang.plugin, configure=False, return_routed_experts=True)
    values, _ = server_fields(asked, str(sparse_step_moe), 0, "cpu")
    assert values["enable_return_routed_experts"] is True
    plain, _ = server_fields(testing.make_config(plasmid_sglang.plugin, configure=False), str(sparse_step_moe), 0,
                             "cpu")
    assert "enable_return_routed_experts" not in plain
