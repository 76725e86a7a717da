"""Checksums and the default deadline of the cross-process syncs (``objectstore``, ``broadcast``)
without Ray. Their deadlines are tested in plasmid-ray's tests with real stuck actors: an engine
actor whose loads wait on an event in its process (the weight-sync contract's stuck engine) and
actors whose process is frozen (``TestStoppedProcesses``); the in-process syncs get theirs from
the weight-sync contract (``test_a_stuck_engine_...``)."""

from __future__ import annotations

import asyncio
import time

import numpy as np
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
    sampled_weights,
)


class Provider:
    """An engine object; ``loaded`` keeps what ``update_weights`` got."""

    def __init__(self) -> None:
        self.loaded = []

    async def update_weights(self, bucket, weight_version):
        self.loaded.append((list(bucket), weight_version))


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


def test_a_phase_past_its_deadline_names_every_engine_not_finished_and_none_that_did():
    guard = SyncGuard(testing.make_config(plasmid_sync.plugin, sync_timeout=0.2), "broadcast")
    engines = [Provider(), Provider(), Provider()]

    async def call(engine, index):
        if index:  # engines 1 and 2 never finish, as members of a collective stalled by one of them
            await asyncio.Event().wait()
        return index

    began = time.perf_counter()
    with pytest.raises(SyncTimeout) as raised:
        testing.run(guard.each_engine("receive", engines, call))
    assert str(raised.value).startswith("weight sync 'broadcast': phase 'receive' of engine 1 (Provider, rank 2) and "
                                        "engine 2 (Provider, rank 3) did not finish within 0.2 s"), raised.value
    assert time.perf_counter() - began < 5
    assert testing.run(guard.each_engine("receive", engines, lambda _engine, index: asyncio.sleep(0, index))) == [
        0, 1, 2]


def test_a_failing_engine_is_raised_at_once_and_the_others_cancelled():
    guard = SyncGuard(testing.make_config(plasmid_sync.plugin, sync_timeout=30), "objectstore")
    cancelled = []

    async def call(engine, index):
        if index == 0:
            raise SyncMismatch("engine 0 refused the bucket")
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(index)
            raise

    began = time.perf_counter()
    with pytest.raises(SyncMismatch, match="engine 0 refused"):
        testing.run(guard.each_engine("load", [Provider(), Provider()], call))
    assert time.perf_counter() - began < 5 and cancelled == [1]


class Exporter:
    """A trainer whose weights are ``tensors``; ``live`` offers them in place (SupportsSharedWeights)."""

    def __init__(self, tensors, live):
        self.tensors, self.exports = tensors, 0
        if live:
            self.shared_weights = lambda: list(self.tensors)

    def export_weights(self, bucket_bytes):
        self.exports += 1
        for index in range(0, len(self.tensors), 3):
            yield [(name, tensor.clone()) for name, tensor in self.tensors[index:index + 3]]


def test_read_back_samples_a_sharing_trainer_in_place_and_picks_what_an_export_would():
    tensors = [(f"w{i}", torch.full((4,), float(i), dtype=torch.bfloat16 if i % 2 else torch.float32))
               for i in range(10)]
    live, exported = Exporter(tensors, live=True), Exporter(tensors, live=False)
    sampled = sampled_weights(live, 1 << 20, 4, seed=7)
    assert live.exports == 0, "a trainer that offers its live tensors must not export the whole model to sample it"
    expected = sampled_weights(exported, 1 << 20, 4, seed=7)
    assert exported.exports == 1 and list(sampled) == list(expected) and len(sampled) == 4
    for name, value in sampled.items():
        assert value.dtype == expected[name].dtype == np.float32 and (value == expected[name]).all()
    tensors[int(next(iter(sampled))[1:])][1].add_(1)  # a later step must not change what was sampled
    assert (sampled[next(iter(sampled))] == expected[next(iter(sampled))]).all()
