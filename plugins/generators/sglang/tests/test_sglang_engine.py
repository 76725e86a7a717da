"""What the ``sglang`` engine does beyond the contract, on real servers: stop tokens exactly as
asked, weight updates under running requests, flushes that are never skipped, balancing over
attached servers, and no memory release on CPU.

A model whose tied embedding (and so its output layer) is zero gives every token the same
logit: every log-prob is exactly ``-ln(16)``, whatever the context. That is the exact check that
an update reached the server and that later tokens use it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import math
import time

import plasmid_sglang.engine
import plasmid_sglang.plugin
import pytest
import torch
from sglang_test_support import gpu_available, reset

from plasmid.errors import ProviderError
from plasmid.testing import build, make_config, run
from plasmid.types import SamplingParams, Status

UNIFORM = -math.log(16)
ZERO_EMBEDDING = ("model.embed_tokens.weight", torch.zeros(16, 64))


@pytest.fixture
def engine(engines, tiny_llama):
    yield engines[0]
    reset(engines[0], tiny_llama)


def test_responses_stop_on_the_tokens_asked_for_only_not_on_the_models_end_of_sequence(engine):
    """The model's <eos> (2) is not a stop token here: SGLang stops on it anyway, the engine continues."""
    params = SamplingParams(temperature=1.0, max_new_tokens=40, stop_token_ids=(3,))

    async def scenario():
        await engine.update_weights([ZERO_EMBEDDING], weight_version=1)  # uniform: 2 and 3 equally likely
        before = engine.stats()["continuations"]
        outputs = await asyncio.gather(*(engine.generate([1, 4, 5], params) for _ in range(12)))
        return outputs, engine.stats()["continuations"] - before

    outputs, continuations = run(scenario())
    for output in outputs:
        assert 3 not in output.token_ids[:-1]
        if output.status is Status.COMPLETED:
            assert output.token_ids[-1] == 3
        else:
            assert output.status is Status.TRUNCATED and len(output.token_ids) == 40
        assert output.logprobs == [pytest.approx(UNIFORM, abs=1e-6)] * len(output.token_ids)
    assert any(2 in output.token_ids[:-1] for output in outputs), "no response went past an <eos>"
    assert continuations >= sum(output.token_ids[:-1].count(2) for output in outputs)


def test_an_update_under_a_running_request_applies_to_its_later_tokens(engine):
    params = SamplingParams(temperature=1.0, max_new_tokens=3000)

    async def scenario():
        running = asyncio.ensure_future(engine.generate([1, 7], params))
        await asyncio.sleep(0.5)
        started = time.perf_counter()
        await engine.update_weights([ZERO_EMBEDDING], weight_version=4)
        update_seconds = time.perf_counter() - started
        assert not running.done(), "the request finished before the update: raise max_new_tokens"
        await asyncio.sleep(0.3)
        await engine.abort_all()
        return await running, update_seconds

    output, update_seconds = run(scenario())
    assert update_seconds < 5, "the update waited for the running request instead of pausing it"
    assert output.status is Status.ABORTED and output.weight_version == 4
    uniform = [abs(lp - UNIFORM) < 1e-6 for lp in output.logprobs]
    first = uniform.index(True)
    assert 0 < first and all(uniform[first:]), "tokens before the update: the old weights; after: the new ones"


def test_a_flush_is_retried_while_a_request_runs_and_fails_loudly_when_it_never_can(engine):
    async def scenario():
        running = asyncio.ensure_future(engine.generate([1, 7], SamplingParams(max_new_tokens=3000)))
        await asyncio.sleep(0.3)
        engine.flush_timeout = 0.5
        try:
            with pytest.raises(ProviderError, match="refused to flush for 0 s .*wrong log-probs"):
                await engine.flush_cache()
        finally:
            engine.flush_timeout = 60.0
        finishing = asyncio.ensure_future(engine.flush_cache())  # retried until the request is gone
        await asyncio.sleep(0.3)
        assert not finishing.done()
        await engine.abort_all()
        await asyncio.wait_for(finishing, timeout=10)
        await running

    run(scenario())


def test_an_engine_attached_to_running_servers_balances_over_them_and_leaves_them_running(engines, tiny_llama,
                                                                                         tmp_path):
    addresses = ",".join(engine.servers[0].url.removeprefix("http://") for engine in engines)
    config = make_config(plasmid_sglang.plugin, run_dir=tmp_path, model=str(tiny_llama),
                         sglang_external_addrs=addresses, sglang_health_interval=0)
    attached = build("engine", "sglang", plasmid_sglang.plugin, config=config)
    assert [server.process for server in attached.servers] == [None, None]
    params = SamplingParams(temperature=1.0, max_new_tokens=20)

    async def scenario():
        outputs = await asyncio.gather(*(attached.generate([1, 4], params) for _ in range(16)))
        await attached.update_weights([ZERO_EMBEDDING], weight_version=2)
        scored = [await engine.score([1, 4, 5, 6], 2, 1.0) for engine in engines]
        await attached.shutdown()
        after = await engines[1].generate([1, 4], SamplingParams(max_new_tokens=2))
        return outputs, scored, after

    try:
        outputs, scored, after = run(scenario())
    finally:
        for engine in engines:
            reset(engine, tiny_llama)
    assert all(len(o.token_ids) == 20 for o in outputs)
    assert sorted(server.requests for server in attached.servers) == [8, 8], "least in flight, ties alternate"
    assert scored == [[pytest.approx(UNIFORM, abs=1e-6)] * 2] * 2, "the update reached both servers"
    assert after.weight_version == 2, "shutting the attached engine down left the servers running"


def test_memory_is_released_and_resumed_only_on_gpu_servers_with_the_memory_saver(engine, monkeypatch):
    calls = []
    real = plasmid_sglang.engine.request

    async def spy(url, path, body=None, **kwargs):
        calls.append((path, body))
        return await real(url, path, body, **kwargs)

    monkeypatch.setattr(plasmid_sglang.engine, "request", spy)
    run(engine.release_memory())
    run(engine.resume_memory())
    released = [(path, body) for path, body in calls if "memory_occupation" in path]
    if not gpu_available():
        assert released == [], "a CPU server died of /release_memory_occupation in sglang 0.5.23"
    else:
        assert released == [("/release_memory_occupation", {}), ("/resume_memory_occupation", {"tags": ["weights"]}),
                            ("/resume_memory_occupation", {"tags": ["kv_cache"]})]


@pytest.mark.skipif(importlib.util.find_spec("sglang_router") is None, reason="sglang-router is not installed")
def test_through_the_router_requests_reach_every_server_and_updates_reach_them_directly(engines, tiny_llama,
                                                                                       tmp_path):
    """Server 0 gets a zero embedding and server 1 keeps the checkpoint: a response's log-probs say
    which server the router sent it to."""
    addresses = ",".join(engine.servers[0].url.removeprefix("http://") for engine in engines)
    config = make_config(plasmid_sglang.plugin, run_dir=tmp_path, model=str(tiny_llama), sglang_router=True,
                         sglang_router_policy="round_robin", sglang_external_addrs=addresses,
                         sglang_health_interval=0)
    params = SamplingParams(temperature=1.0, max_new_tokens=4)

    async def scenario(routed):
        await engines[0].update_weights([ZERO_EMBEDDING], weight_version=1)
        outputs = [await routed.generate([1, 4], params) for _ in range(8)]
        await routed.update_weights([ZERO_EMBEDDING], weight_version=2)
        after = [await routed.generate([1, 4], params) for _ in range(4)]
        return outputs, after

    routed = build("engine", "sglang", plasmid_sglang.plugin, config=config)
    urls = [engine.servers[0].url for engine in engines]
    try:
        assert {w["url"] for w in routed.router.workers()} == set(urls)
        outputs, after = run(scenario(routed))
        renamed = urls[0].replace("127.0.0.1", "localhost")  # the same server under a new address,
        routed.router.replace_worker(urls[0], renamed, timeout=60)  # as after a restart
        assert {w["url"] for w in routed.router.workers()} == {renamed, urls[1]}
    finally:
        routed.close()
        for engine in engines:
            reset(engine, tiny_llama)
    uniform = [max(abs(lp - UNIFORM) for lp in output.logprobs) < 1e-6 for output in outputs]
    assert sorted(uniform) == [False] * 4 + [True] * 4, "round robin: half of the requests to each server"
    assert all(output.weight_version == (1 if flat else 0) for output, flat in zip(outputs, uniform, strict=True))
    assert all(output.weight_version == 2 and max(abs(lp - UNIFORM) for lp in output.logprobs) < 1e-6
               for output in after), "the update went to both servers, not through the router"
    assert routed.router.process is None and engines[1].servers[0].healthy.is_set()
