"""Loaded checksums (:meth:`plasmid_torch.sync_guard.SyncGuard.check_loaded`): the sample both sides
agree on, and ``inprocess`` asking an engine that loads through a server of its own (SGLang, vLLM:
``loaded_checksums``) for CRC32s of what it holds after each bucket. The engines' own reports are
tested against real servers in plasmid-sglang's and plasmid-vllm's weight-sync contract tests."""

from __future__ import annotations

import plasmid_sync.plugin
import pytest
import torch

from plasmid import testing
from plasmid_torch.sync_guard import (
    LOADED_BYTES_PER_TENSOR,
    LOADED_TENSORS_PER_BUCKET,
    SyncMismatch,
    loaded_checksum,
    loaded_rows,
    loaded_sample,
    loaded_seed,
)


def test_the_sample_takes_the_first_rows_that_fit_the_byte_cap_of_float32():
    row = 1000
    assert loaded_rows((10_000, row)) == LOADED_BYTES_PER_TENSOR // (4 * row) < 10_000
    assert loaded_rows((3, 4)) == 3
    assert loaded_rows((2, LOADED_BYTES_PER_TENSOR)) == 1, "at least one row, however wide"
    assert loaded_rows(()) == 0, "a scalar is checked whole"


def test_the_sample_is_one_floating_tensor_per_bucket_drawn_by_the_seed():
    bucket = [(f"t{i}", torch.full((4, 2), float(i))) for i in range(20)] + [("ids", torch.arange(5))]
    draws = {tuple(name for name, _, _ in loaded_sample(bucket, loaded_seed(3, index))) for index in range(30)}
    assert all(len(names) == LOADED_TENSORS_PER_BUCKET for names in draws)
    assert len(draws) > 5 and ("ids",) not in draws, "seeded draws vary over buckets and skip integer tensors"
    assert loaded_sample(bucket, 17) == loaded_sample(bucket, 17)
    assert loaded_sample([("ids", torch.arange(5))], 1) == []


def test_the_sample_accepts_the_trainers_values_and_their_bfloat16_rounding_only():
    value = torch.linspace(-1, 1, 12).reshape(3, 4) + 1e-4
    ((name, rows, accepted),) = loaded_sample([("w", value)], 0)
    assert (name, rows) == ("w", 3)
    assert accepted == [loaded_checksum(value), loaded_checksum(value.to(torch.bfloat16))]
    assert loaded_checksum(value.to(torch.bfloat16).float().numpy()) in accepted, "bfloat16 read back as float32"
    assert loaded_checksum(value + 1e-3) not in accepted


class Trainer:
    def export_weights(self, bucket_bytes):
        yield [("a.weight", torch.arange(12.0).reshape(3, 4)), ("a.bias", torch.ones(3))]
        yield [("b.weight", torch.full((2, 2), 0.5))]


class ServedEngine:
    """An engine that loads through a server of its own and reports CRC32s of what it holds;
    ``skew`` is added to every value it loads (an engine that loads something else)."""

    def __init__(self, skew=0.0):
        self.held, self.skew, self.asked, self.weight_version = {}, skew, 0, 0

    async def update_weights(self, bucket, weight_version):
        self.held.update({name: tensor.clone() + self.skew for name, tensor in bucket})
        self.weight_version = weight_version

    async def loaded_checksums(self, requests):
        self.asked += 1
        return {name: loaded_checksum(self.held[name][:rows] if rows else self.held[name]) for name, rows in requests}

    async def flush_cache(self):
        pass


def inprocess(tmp_path, **options):
    config = testing.make_config(plasmid_sync.plugin, run_dir=tmp_path, verify_sync_every=0, **options)
    return testing.build("weight_sync", "inprocess", plasmid_sync.plugin, config=config)


def test_inprocess_checks_what_each_engine_holds_after_every_bucket(tmp_path):
    engines = [ServedEngine(), ServedEngine()]
    report = testing.run(inprocess(tmp_path).sync(Trainer(), engines, 5))
    assert report.metrics["sync/loaded_checksums"] == 2 * 2 and [e.asked for e in engines] == [2, 2]


def test_inprocess_refuses_an_engine_that_holds_other_values(tmp_path):
    with pytest.raises(SyncMismatch, match=r"weight sync 'inprocess': tensor 'a\.(weight|bias)' loaded by engine 1 "
                       r"\(ServedEngine, rank 2\) has CRC32 .* \(first 3 rows as float32\)"):
        testing.run(inprocess(tmp_path).sync(Trainer(), [ServedEngine(), ServedEngine(skew=1e-6)], 1))


def test_inprocess_asks_nothing_with_sync_checksums_off(tmp_path):
    engine = ServedEngine(skew=1.0)
    report = testing.run(inprocess(tmp_path, sync_checksums="off").sync(Trainer(), [engine], 1))
    assert engine.asked == 0 and "sync/loaded_checksums" not in report.metrics
