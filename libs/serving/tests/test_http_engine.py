"""plasmid_serving.engine.HttpEngine, driven through FakeEngine (serving_fakes) on fake servers:
generate and its retries, the weight journal replayed into a restarted server, abort_all,
response_logprobs' argument checks, flushes, memory calls and what happens after shutdown."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from serving_fakes import FakeEngine, FakeServer

import plasmid_serving.health
from plasmid.errors import ProviderError
from plasmid.types import SamplingParams, Status
from plasmid_serving.http import ServerCallFailed

PARAMS = SamplingParams(max_new_tokens=3)


@pytest.fixture(autouse=True)
def quick_checks(monkeypatch):
    """A silent fake server fails a health check after 0.5 s, not 30."""
    monkeypatch.setattr(plasmid_serving.health, "CHECK_TIMEOUT", 0.5)


@pytest.fixture
def make(tmp_path):
    built = []

    def build(**kwargs) -> FakeEngine:
        engine = FakeEngine(tmp_path, **kwargs)
        built.append(engine)
        return engine

    yield build
    for engine in built:
        engine.close()


def wait_for(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        time.sleep(0.05)


def test_generate_answers_and_counts(make):
    engine = make()
    output = asyncio.run(engine.generate([1, 2, 3, 4], PARAMS))
    assert (output.token_ids, output.status, output.weight_version) == ([2, 3, 4], Status.TRUNCATED, 0)
    stats = engine.stats()
    assert (stats["requests"], stats["prompt_tokens"], stats["generated_tokens"], stats["retries"]) == (1, 4, 3, 0)
    assert engine.servers[0].requests == 1 and engine.servers[0].in_flight == 0


def test_generate_is_retried_on_another_healthy_server_when_one_goes_silent(make):
    engine = make(servers=2, request_timeout=1.0, health_interval=60)
    silent = engine.fake(0)
    silent.silent = True
    output = asyncio.run(engine.generate([5, 6], PARAMS))
    assert output.token_ids == [6, 7] and output.status is Status.TRUNCATED
    assert engine.stats()["retries"] == 1
    assert (engine.servers[0].requests, engine.servers[1].requests) == (0, 1)
    assert engine.fake(1).answered == 1


def test_generate_gives_up_after_the_retries_naming_the_server_and_the_option(make):
    engine = make(request_timeout=0.5, request_retries=1)   # no monitor: the silent server is retried directly
    engine.fake(0).silent = True
    with pytest.raises(ProviderError, match=r"fake generate: Fake server 0 .* did not answer .*, 1 retries used "
                                            r"\(--fake-request-retries\)"):
        asyncio.run(engine.generate([1], PARAMS))
    engine.fake(0).silent = False


def test_a_crashed_server_is_restarted_and_replays_the_journal_disk_buckets_and_adapter(make):
    engine = make(health_interval=0.2)
    server = engine.servers[0]

    async def load() -> None:
        await engine.update_weights([("embed", [1.0])], weight_version=1)
        await engine.load_weights_from_disk("/ckpt/v2", weight_version=2)
        await engine.update_weights([("embed", [3.0])], weight_version=3)
        await engine.update_weights([("head", [4.0])], weight_version=4)
        await engine.update_weights([("embed", [5.0])], weight_version=5)   # replaces the bucket of version 3
        await engine.load_adapter("/adapters/6", weight_version=6)

    asyncio.run(load())
    first = engine.fake(0)
    assert [kind for kind, _ in first.loads] == ["load", "load_disk", "load", "load", "load", "adapter"]
    server.process.kill()
    wait_for(lambda: server.restarts == 1 and server.healthy.is_set(), "the restart")
    replayed = engine.fake(0)
    assert replayed is not first
    assert replayed.loads == [("load_disk", "/ckpt/v2"), ("load", json.dumps({"head": [4.0]})),
                              ("load", json.dumps({"embed": [5.0]})), ("adapter", ["fake-v6", "/adapters/6"])]
    assert replayed.version == 6 == engine.weight_version
    output = asyncio.run(engine.generate([1, 2], PARAMS))
    assert output.token_ids == [2, 3] and engine.stats()["restarts"] == 1


def test_weights_the_journal_lost_put_a_restarted_server_out_of_service(make):
    engine = make(health_interval=0.2)
    server = engine.servers[0]
    asyncio.run(engine.note_external_update(3, "a distributed group"))
    assert engine.weight_version == 3 and engine.fake(0).version == 3 and "/flush" in engine.fake(0).calls
    server.process.kill()
    wait_for(lambda: server.failure is not None, "the restart")
    assert "weights (version 3) came through a distributed group and cannot be restored" in server.failure
    with pytest.raises(ProviderError, match="is out of service: the restart failed"):
        asyncio.run(engine.generate([1], PARAMS))


def test_buckets_sent_as_handles_are_lost_too_and_a_bad_name_is_refused_before_sending(make):
    engine = make()
    engine.ipc = True
    asyncio.run(engine.update_weights([("embed", [1.0])], weight_version=1))
    assert engine.journal.snapshot().lost == "CUDA IPC handles"
    with pytest.raises(ValueError, match="no tensor 'lm_head'"):
        asyncio.run(engine.update_weights([("lm_head", [1.0])], weight_version=2))
    assert engine.weight_version == 1 and len(engine.fake(0).loads) == 1


def test_abort_all_ends_every_request_in_flight_as_aborted(make):
    engine = make(servers=2)
    engine.hold = True

    async def scenario():
        running = [asyncio.ensure_future(engine.generate([1, 2, 3], PARAMS)) for _ in range(4)]
        while engine.fake(0).running + engine.fake(1).running < 4:
            await asyncio.sleep(0.02)
        aborted = await engine.abort_all()
        return aborted, await asyncio.gather(*running)

    aborted, outputs = asyncio.run(asyncio.wait_for(scenario(), timeout=60))
    assert aborted == 4 and all(output.status is Status.ABORTED for output in outputs)
    assert outputs[0].token_ids == [2]
    assert engine.fake(0).calls.count("/abort") >= 1 and engine.fake(1).calls.count("/abort") >= 1
    assert engine.stats()["aborted"] == 4
    assert asyncio.run(engine.abort_all()) == 0   # nothing in flight


def test_abort_all_cancels_requests_a_server_does_not_abort_after_the_grace(make):
    engine = make(abort_grace=0.3)
    engine.hold = True
    engine.fake(0).deaf_to_abort = True

    async def scenario():
        running = asyncio.ensure_future(engine.generate([1, 2], PARAMS))
        while engine.fake(0).running < 1:
            await asyncio.sleep(0.02)
        return await engine.abort_all(), await running

    aborted, output = asyncio.run(asyncio.wait_for(scenario(), timeout=60))
    assert aborted == 1 and output.status is Status.ABORTED and output.token_ids == []


def test_response_logprobs_checks_its_arguments(make):
    engine = make()
    assert asyncio.run(engine.response_logprobs([1, 2, 3, 4], 2, 1.0)) == [-0.5, -1.0]
    assert asyncio.run(engine.score([1, 2, 3], 1, 0.5)) == [-1.0, -2.0]
    assert asyncio.run(engine.response_logprobs([1, 2], 2, 1.0)) == []
    for prompt_length in (0, 5):
        with pytest.raises(ValueError, match=rf"fake score: prompt_length must be in \[1, 4\] .*got {prompt_length}"):
            asyncio.run(engine.response_logprobs([1, 2, 3, 4], prompt_length, 1.0))
    with pytest.raises(ValueError, match=r"token_ids holds token id 16, outside the vocabulary of the model at "
                                         r"/models/fake \(ids 0..15\)"):
        asyncio.run(engine.response_logprobs([1, 16], 1, 1.0))
    with pytest.raises(ValueError, match="fake generate: prompt_ids is empty"):
        asyncio.run(engine.generate([], PARAMS))
    with pytest.raises(ValueError, match="prompt_ids holds token id -1"):
        asyncio.run(engine.generate([-1], PARAMS))


def test_flush_is_retried_while_refused_and_memory_calls_go_stage_by_stage(make):
    engine = make()
    fake = engine.fake(0)
    fake.flush_refusals = 2
    asyncio.run(engine.flush_cache())
    assert fake.calls.count("/flush") == 3 and fake.flush_refusals == 0
    asyncio.run(engine.release_memory())
    asyncio.run(engine.resume_memory())
    assert [call for call in fake.calls if call != "/flush"] == ["/release", "/resume", "/resume"]


def test_a_failed_control_call_names_the_server_the_endpoint_and_its_message(make):
    engine = make()
    with pytest.raises(ServerCallFailed, match=r"Fake server http://127.0.0.1:\d+: /nowhere failed \(HTTP 404\)"):
        asyncio.run(engine._control(engine.servers[0], "/nowhere", {}))


def test_attached_servers_are_probed_and_a_silent_address_is_refused(tmp_path):
    fake = FakeServer()
    fake.start()
    try:
        engine = FakeEngine(tmp_path, external_addrs=f"127.0.0.1:{fake.port}")
        try:
            assert engine.servers[0].process is None and asyncio.run(engine.generate([3], PARAMS)).token_ids == [4]
        finally:
            engine.close()
        fake.silent = True
        with pytest.raises(ProviderError, match=rf"--fake-external-addrs 127.0.0.1:{fake.port}: no Fake server "
                                                r"answers there"):
            FakeEngine(tmp_path, external_addrs=f"127.0.0.1:{fake.port}", startup_timeout=1.0)
    finally:
        fake.silent = False
        fake.stop()


def test_calls_after_shutdown_raise_and_the_servers_are_stopped(make):
    engine = make()
    process = engine.servers[0].process
    asyncio.run(engine.shutdown())
    asyncio.run(engine.shutdown())   # twice is fine
    assert process.server is None and process.process is None
    calls = {"generate": engine.generate([1], PARAMS), "score": engine.response_logprobs([1, 2], 1, 1.0),
             "abort_all": engine.abort_all(), "update_weights": engine.update_weights([("embed", [1.0])], 1),
             "flush_cache": engine.flush_cache(), "release_memory": engine.release_memory()}
    for method, call in calls.items():
        with pytest.raises(RuntimeError, match=f"fake {method}: the engine was shut down; build a new one"):
            asyncio.run(call)
