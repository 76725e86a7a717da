"""Deadlines and checksums of the cross-process syncs (``objectstore``, ``broadcast``) without Ray:
the trainer and engines are proxies (``plasmid_call``) that run each call in this process, and
one of them stops answering, as a hung actor does. Their full contract runs in plasmid-ray's tests;
the in-process syncs get theirs from the weight-sync contract (``test_a_stuck_engine_...``)."""

from __future__ import annotations

import asyncio
import time

import plasmid_sync.plugin
import pytest
import torch
from plasmid_sync.objectstore import load_bucket

from plasmid import testing
from plasmid_torch.sync_guard import (
    FLOOR_SECONDS,
    SyncGuard,
    SyncMismatch,
    SyncTimeout,
    bucket_checksums,
    check_received,
    model_bytes_estimate,
)


class Provider:
    """A trainer or engine object; ``loaded`` keeps what ``update_weights`` got."""

    def __init__(self) -> None:
        self.loaded = []

    async def update_weights(self, bucket, weight_version):
        self.loaded.append((list(bucket), weight_version))

    async def flush_cache(self):
        return None

    def export_weights(self, bucket_bytes):
        yield [("w", torch.ones(4))]


class Proxy:
    """Runs calls in this process, like a runtime's proxy does in the actor's; ``hang_on`` names
    functions whose call never returns (the process stopped answering)."""

    def __init__(self, target, hang_on=()):
        self.target, self.hang_on = target, set(hang_on)

    async def plasmid_call(self, fn, *args):
        if fn.__name__ in self.hang_on or "*" in self.hang_on:
            await asyncio.Event().wait()
        result = fn(self.target, *args)
        return await result if asyncio.iscoroutine(result) else result

    async def flush_cache(self):
        return None


def run_stuck(provider, trainer, engines, timeout=0.5):
    config = testing.make_config(plasmid_sync.plugin, sync_timeout=timeout)
    sync = testing.build("weight_sync", provider, plasmid_sync.plugin, config=config)
    began = time.perf_counter()
    with pytest.raises(SyncTimeout) as raised:
        testing.run(sync.sync(trainer, engines, 1))
    return str(raised.value), time.perf_counter() - began


def test_objectstore_names_the_trainer_when_it_stops_putting_buckets():
    message, waited = run_stuck("objectstore", Proxy(Provider(), hang_on={"put_next_bucket"}),
                                [Proxy(Provider())])
    assert message.startswith("weight sync 'objectstore': phase 'gather' of the trainer (Proxy, rank 0) did not "
                              "finish within 0.5 s"), message
    assert waited < 5


def test_broadcast_names_the_engine_that_never_joins():
    message, waited = run_stuck("broadcast", Proxy(Provider()), [Proxy(Provider()), Proxy(Provider(), hang_on="*")])
    assert message.startswith("weight sync 'broadcast': phase 'connect' of engine 1 (Proxy, rank 2) did not finish "
                              "within 0.5 s"), message
    assert waited < 5


def test_objectstore_engine_refuses_a_bucket_that_changed_on_its_way():
    bucket = [("a", torch.arange(6.0)), ("b", torch.ones(3, dtype=torch.bfloat16))]
    sums = bucket_checksums(bucket)
    changed = [("a", bucket[0][1]), ("b", bucket[1][1] * 2)]

    async def arrived(value):
        return value

    engine = Provider()
    testing.run(load_bucket(engine, [arrived(bucket)], 3, sums, "engine 0 (Provider, rank 1)"))
    assert engine.loaded[0][1] == 3
    with pytest.raises(SyncMismatch, match=r"weight sync 'objectstore': tensor 'b' received by engine 0 \(Provider, "
                                           r"rank 1\) has CRC32 [0-9a-f]{8}, the trainer sent [0-9a-f]{8}"):
        testing.run(load_bucket(engine, [arrived(changed)], 4, sums, "engine 0 (Provider, rank 1)"))
    assert len(engine.loaded) == 1, "a refused bucket must not be loaded"


def test_a_bucket_with_tensors_missing_is_refused():
    bucket = [("a", torch.zeros(2)), ("b", torch.zeros(2))]
    with pytest.raises(SyncMismatch, match="received 1 tensors in a bucket of 2 sent"):
        check_received(bucket[:1], bucket_checksums(bucket), "broadcast", "engine 0")


def test_the_default_deadline_grows_with_the_bytes_moved(tmp_path):
    guard = SyncGuard(testing.make_config(plasmid_sync.plugin), "disk")
    assert guard.deadline(1_000) == FLOOR_SECONDS
    assert guard.deadline(10_000_000_000) == pytest.approx(200.0)  # 10 GB at 50 MB/s
    guard.moved(20_000_000_000)
    assert guard.deadline() == pytest.approx(400.0)
    assert SyncGuard(testing.make_config(plasmid_sync.plugin, sync_timeout=2.5), "disk").deadline(10**12) == 2.5
    (tmp_path / "model.safetensors").write_bytes(b"x" * 1000)
    assert model_bytes_estimate(tmp_path) == 2000 and model_bytes_estimate(tmp_path / "absent") == 0
