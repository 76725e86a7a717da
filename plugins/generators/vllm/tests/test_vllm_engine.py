"""What the ``vllm`` engine does beyond the generator contract, on the session's real server:
attaching to a running server (``--vllm-external-addrs``), one-line errors for bad input, the
server log in ``<run dir>/vllm``, and a killed server restarted by the health monitor with the
engine's weights and version put back."""

from __future__ import annotations

import math
import time

import plasmid_vllm.plugin
import pytest
import torch
from vllm_test_support import reset

from plasmid.errors import ProviderError
from plasmid.testing import build, make_config, run
from plasmid.types import SamplingParams

ZERO_EMBEDDING = ("model.embed_tokens.weight", torch.zeros(16, 64))


def test_the_server_log_is_in_the_run_directory(engine):
    log = engine.servers[0].process.log_path
    assert log.parent.name == "vllm" and "vllm.entrypoints.openai.api_server" in log.read_text()


def test_bad_input_is_a_one_line_error_naming_it(engine):
    with pytest.raises(ValueError, match="token id 99, outside the vocabulary"):
        run(engine.generate([1, 99], SamplingParams()))
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        run(engine.generate([], SamplingParams()))
    with pytest.raises(ValueError, match=r"model.norm.weight has shape \(3,\), but the served tensor is \(64,\)"):
        run(engine.update_weights([("model.norm.weight", torch.zeros(3))], 1))


def test_an_engine_attached_to_a_running_server_serves_and_updates_it(engine, tiny_qwen, tmp_path):
    config = make_config(plasmid_vllm.plugin, run_dir=tmp_path / "run", model=str(tiny_qwen),
                         vllm_external_addrs=engine.servers[0].url.removeprefix("http://"))
    attached = build("engine", "vllm", plasmid_vllm.plugin, config=config)
    try:
        assert attached.servers[0].process is None
        run(attached.update_weights([ZERO_EMBEDDING], weight_version=2))
        scored = run(engine.score([1, 4, 5, 6], 2, 1.0))  # the launching engine sees the attached one's update
        assert max(abs(v + math.log(16)) for v in scored) < 1e-6
    finally:
        attached.close()
        reset(engine, tiny_qwen)


def test_attaching_where_no_server_answers_is_a_one_line_error(tiny_qwen, tmp_path):
    from plasmid_vllm.server import free_port

    config = make_config(plasmid_vllm.plugin, run_dir=tmp_path / "run", model=str(tiny_qwen),
                         vllm_external_addrs=f"127.0.0.1:{free_port()}")
    with pytest.raises(ProviderError, match="no vLLM server answers there"):
        build("engine", "vllm", plasmid_vllm.plugin, config=config)


@pytest.mark.timeout(900)
def test_a_killed_server_is_restarted_with_the_engines_weights_and_version(engine, tiny_qwen):
    try:
        run(engine.update_weights([ZERO_EMBEDDING], weight_version=4))
        engine.servers[0].process.kill()
        deadline = time.monotonic() + 800
        while engine.restarts == 0 and time.monotonic() < deadline:
            time.sleep(0.5)
        scored = run(engine.score([1, 4, 5, 6], 2, 1.0))  # waits until the restarted server is ready
        assert engine.restarts == 1 and engine.servers[0].failure is None
        assert max(abs(v + math.log(16)) for v in scored) < 1e-6, "the restarted server got the update back"
        assert engine.weight_version == 4
    finally:
        reset(engine, tiny_qwen)
