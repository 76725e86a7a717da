"""A server that dies is restarted by the health monitor, given the engine's current weights and
version back, and the requests that were in flight on it are answered as if nothing happened."""

from __future__ import annotations

import asyncio
import math

import torch
from sglang_test_support import reset

from plasmid.testing import run
from plasmid.types import SamplingParams, Status

UNIFORM = -math.log(16)


def test_a_killed_server_is_restarted_with_the_current_weights_and_in_flight_requests_retried(engines, tiny_llama,
                                                                                             capfd):
    engine = engines[1]
    server = engine.servers[0]
    old_url, restarts = server.url, engine.stats()["restarts"]
    params = SamplingParams(temperature=1.0, max_new_tokens=800)

    async def scenario():
        await engine.update_weights([("model.embed_tokens.weight", torch.zeros(16, 64))], weight_version=5)
        running = [asyncio.ensure_future(engine.generate([1, 4, 5], params)) for _ in range(3)]
        await asyncio.sleep(0.5)
        assert not any(r.done() for r in running), "the requests ended before the crash: raise max_new_tokens"
        server.process.kill()  # SIGKILL to the whole process group: scheduler and detokenizer too
        outputs = await asyncio.wait_for(asyncio.gather(*running), timeout=400)
        scored = await engine.score([1, 4, 5, 6, 7], 3, 1.0)
        return outputs, scored

    try:
        outputs, scored = run(scenario())
    finally:
        reset(engine, tiny_llama)
    assert engine.stats()["restarts"] == restarts + 1 and server.url != old_url
    assert engine.stats()["retries"] >= 3
    for output in outputs:
        assert output.status is Status.TRUNCATED and len(output.token_ids) == 800
        assert output.weight_version == 5
        assert max(abs(lp - UNIFORM) for lp in output.logprobs) < 1e-6, "served with the restored weights"
    assert max(abs(lp - UNIFORM) for lp in scored) < 1e-6
    messages = capfd.readouterr().err
    assert "restarting it (restart 1 of 3)" in messages and "restored weight version 5 (1 buckets" in messages
