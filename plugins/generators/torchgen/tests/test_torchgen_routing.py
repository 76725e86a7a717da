"""``--return-routed-experts`` in torchgen (:mod:`plasmid_torchgen.routing`): the MoE routing of
every fed token of each response, under continuous batching, equal to a one-sequence forward pass
over the finished tokens; off by default (no hook on the routers); refused for a dense model."""

from __future__ import annotations

import asyncio

import pytest
import torch
from plasmid_torchgen.routing import RoutingCapture, moe_routers

from plasmid.errors import UsageError
from plasmid.testing import run
from plasmid.types import SamplingParams
from plasmid_torch.hf import load_causal_lm
from plasmid_torch.tiny import build_tiny_model


@pytest.fixture(scope="module", params=["qwen2_moe", "qwen3_moe"])
def moe_dir(request, tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp(request.param) / "model", arch=request.param)


def reference_routing(model_dir, tokens):
    """``[tokens, layers, top_k]`` sorted expert ids of one unpadded forward over ``tokens``."""
    model = load_causal_lm(str(model_dir))
    seen = []
    handles = [router.register_forward_hook(lambda m, i, out, k=top_k: seen.append(out[-1].view(-1, k)))
               for router, top_k in moe_routers(model)]
    with torch.no_grad():
        model(input_ids=torch.tensor([tokens]))
    for handle in handles:
        handle.remove()
    return torch.stack(seen, dim=1).sort(-1).values


def test_each_response_reports_the_routing_of_its_fed_tokens(make_engine, moe_dir):
    engine = make_engine(moe_dir, return_routed_experts=True)
    prompts = [[1, 5, 6, 7], [1, 8], [1, 9, 10, 11, 12, 5, 6]]             # left padding in the prefill

    async def generate_all():
        # the third request arrives after the first two decode a few steps: it joins a running batch
        first = [asyncio.ensure_future(engine.generate(p, SamplingParams(max_new_tokens=n, seed=i)))
                 for i, (p, n) in enumerate(zip(prompts[:2], (12, 3), strict=True))]
        await asyncio.sleep(0.05)
        last = engine.generate(prompts[2], SamplingParams(max_new_tokens=5, seed=2))
        return [*await asyncio.gather(*first), await last]

    outputs = run(generate_all())
    layers = len(moe_routers(engine.model))
    assert layers == 2
    for prompt, output in zip(prompts, outputs, strict=True):
        tokens = prompt + output.token_ids
        routed = torch.tensor(output.routed_experts)
        assert list(routed.shape) == [len(tokens) - 1, layers, 2]       # the last sampled token is never fed
        assert torch.equal(routed.sort(-1).values, reference_routing(moe_dir, tokens)[:-1]), tokens
    assert not engine._decoder.routing._routes                           # nothing kept after the answers


def test_requests_sharing_a_prompt_each_get_the_routing_of_its_tokens(make_engine, moe_dir):
    """Requests with one prompt share its prefill row (``Decoder.prefill``); each still reports
    the prompt's routing, then its own response's."""
    engine = make_engine(moe_dir, return_routed_experts=True)
    prompts = [[1, 5, 6, 7], [1, 8], [1, 5, 6, 7], [1, 5, 6, 7]]
    outputs = run(engine.generate_many(prompts, [SamplingParams(max_new_tokens=4, seed=i) for i in range(4)]))
    assert engine.stats()["shared_prompt_tokens"] == 8
    for prompt, output in zip(prompts, outputs, strict=True):
        tokens = prompt + output.token_ids
        routed = torch.tensor(output.routed_experts)
        assert torch.equal(routed.sort(-1).values, reference_routing(moe_dir, tokens)[:-1]), tokens


def test_off_by_default_and_refused_for_a_dense_model(make_engine, moe_dir, tmp_path):
    engine = make_engine(moe_dir)
    assert engine._decoder.routing is None
    assert all(not router._forward_hooks for router, _ in moe_routers(engine.model))
    output = run(engine.generate([1, 5, 6], SamplingParams(max_new_tokens=3, seed=0)))
    assert output.routed_experts is None
    dense = build_tiny_model(tmp_path / "dense")
    with pytest.raises(UsageError, match=r"--return-routed-experts: the model at .*dense has no mixture-of-experts"):
        make_engine(dense, return_routed_experts=True)


def test_capture_removes_its_hooks(moe_dir):
    model = load_causal_lm(str(moe_dir))
    capture = RoutingCapture(model, str(moe_dir))
    assert all(router._forward_hooks for router, _ in moe_routers(model))
    capture.remove()
    assert all(not router._forward_hooks for router, _ in moe_routers(model))
