"""The check that ends a verifying ``vllm-nccl`` sync, without servers or a GPU: whether a server can
read its weights back (only with plasmid's worker extension: vLLM has no API for it), and the sync
ending with :meth:`SyncGuard.verify`, which probes an engine that cannot; its ``send`` deadline and
the loaded checksums an engine with plasmid's worker extension reports. The stand-in trainer
answers the NCCL broadcast itself (it needs CUDA and vLLM's transfer engine)."""

from __future__ import annotations

import asyncio
import json
import time

import plasmid_sync.plugin
import plasmid_vllm.plugin
import pytest
from plasmid_vllm.server import WORKER_EXTENSION, has_weight_readback, server_values
from plasmid_vllm.syncs import send_over_nccl

from plasmid import testing
from plasmid_torch.sync_guard import SyncMismatch, SyncTimeout

VOCAB = 16


def test_only_servers_with_plasmids_worker_extension_read_weights_back(tmp_path):
    config = testing.make_config(plasmid_vllm.plugin, model=str(tmp_path))
    values = server_values(config, str(tmp_path), ordinal=0, device="cpu")
    assert values["worker_extension_cls"] == WORKER_EXTENSION and has_weight_readback(values)
    assert not has_weight_readback({**values, "worker_extension_cls": "mylab.worker.OwnExtension"})
    assert not has_weight_readback({})


def logprob(token, position):
    return -0.1 * (token + 1) - 0.01 * position


class Trainer:
    """Runs calls as a runtime's proxy would; the NCCL broadcast is answered with (bytes, buckets)."""

    async def plasmid_call(self, fn, *args):
        if fn is send_over_nccl:
            return 1024, 1
        return fn(self, *args)

    async def logprobs(self, samples, temperature):
        return [[logprob(t, i) for i, t in enumerate(s.tokens[s.prompt_length:])] for s in samples]


class Server:
    url, failure = "http://127.0.0.1:1", None


class Engine:
    """A vLLM engine whose server runs another worker extension: it cannot read weights back."""

    reads_weights_back = False

    def __init__(self, offset=0.0):
        self.servers, self.offset, self.updates = [Server()], offset, []

    async def note_external_update(self, weight_version, how):
        self.updates.append((weight_version, how))

    async def get_weights(self, names):
        raise AssertionError("the guard read back from an engine that says it cannot")

    async def response_logprobs(self, token_ids, prompt_length, temperature):
        return [logprob(t, i) + self.offset for i, t in enumerate(token_ids[prompt_length:])]


def nccl_sync(tmp_path, **options):
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": VOCAB}))
    config = testing.make_config(plasmid_vllm.plugin, plasmid_sync.plugin, model=str(tmp_path),
                                 run_dir=tmp_path / "run", **{"verify_sync_every": 1, **options})
    return testing.build("weight_sync", "vllm-nccl", plasmid_vllm.plugin, plasmid_sync.plugin, config=config)


def test_a_verifying_nccl_sync_probes_an_engine_without_read_back(tmp_path):
    engine = Engine()
    report = testing.run(nccl_sync(tmp_path).sync(Trainer(), [engine], 4))
    assert engine.updates == [(4, "vllm-nccl")]
    assert report.metrics == {"sync/probed_engines": 1.0, "sync/probe_max_diff": 0.0}


def test_a_verifying_nccl_sync_fails_when_the_engine_serves_other_weights(tmp_path):
    with pytest.raises(SyncMismatch, match=r"weight sync 'vllm-nccl': the probe's log-probs from engine 0 \(Engine"):
        testing.run(nccl_sync(tmp_path).sync(Trainer(), [Engine(offset=0.1)], 1))


class ExportingTrainer(Trainer):
    """Also exports two buckets of weights (for the loaded checksums' sample)."""

    def export_weights(self, bucket_bytes):
        import torch

        yield [("a.weight", torch.arange(12.0).reshape(3, 4)), ("a.bias", torch.ones(3))]
        yield [("b.weight", torch.full((2, 2), 0.5))]


class ReportingEngine(Engine):
    """An engine with plasmid's worker extension: it reports CRC32s of what it holds (``held``)."""

    reads_weights_back = True

    def __init__(self, held):
        super().__init__()
        self.held, self.asked = held, []

    async def loaded_checksums(self, requests):
        from plasmid_torch.sync_guard import loaded_checksum

        self.asked.append(list(requests))
        return {name: loaded_checksum(self.held[name][:rows] if rows else self.held[name]) for name, rows in requests}


def trained():
    return {name: tensor.clone() for bucket in ExportingTrainer().export_weights(0) for name, tensor in bucket}


def test_an_nccl_sync_compares_the_checksums_each_engine_reports_of_one_tensor_per_bucket(tmp_path):
    engine = ReportingEngine(trained())
    sync = nccl_sync(tmp_path, verify_sync_every=0)
    report = testing.run(sync.sync(ExportingTrainer(), [engine], 2))
    assert report.metrics == {"sync/loaded_checksums": 2.0}
    (first,), (second,) = engine.asked[0][:1], engine.asked[0][1:]
    assert first[0] in ("a.weight", "a.bias") and second == ("b.weight", 2)


def test_an_nccl_sync_fails_when_an_engine_holds_other_values_than_it_was_sent(tmp_path):
    held = trained()
    for tensor in held.values():
        tensor.view(-1)[0] += 1
    sync = nccl_sync(tmp_path)
    with pytest.raises(SyncMismatch, match=r"weight sync 'vllm-nccl': tensor 'a\.(weight|bias)' loaded by engine 0 "
                       r"\(ReportingEngine, rank 1\) has CRC32 [0-9a-f]{8} \(first \d+ rows as float32\), the "
                       r"trainer's is [0-9a-f]{8}; the engine did not load what was sent \(--sync-checksums\)"):
        testing.run(sync.sync(ExportingTrainer(), [ReportingEngine(held)], 1))


def test_no_loaded_checksums_with_sync_checksums_off(tmp_path):
    held = trained()
    held["b.weight"] += 1
    engine = ReportingEngine(held)
    sync = nccl_sync(tmp_path, verify_sync_every=0, sync_checksums="off")
    assert testing.run(sync.sync(ExportingTrainer(), [engine], 1)).metrics == {}
    assert engine.asked == []


class StalledTrainer(Trainer):
    """A trainer whose NCCL broadcast never finishes (a server that never joins the collective)."""

    async def plasmid_call(self, fn, *args):
        if fn is send_over_nccl:
            await asyncio.Event().wait()
        return await super().plasmid_call(fn, *args)


def test_a_broadcast_past_sync_timeout_is_one_error_naming_the_phase(tmp_path):
    began = time.perf_counter()
    with pytest.raises(SyncTimeout) as raised:
        testing.run(nccl_sync(tmp_path, sync_timeout=0.5).sync(StalledTrainer(), [Engine()], 1))
    assert time.perf_counter() - began < 5, "the sync waited for the broadcast, not for its deadline"
    assert str(raised.value).startswith("weight sync 'vllm-nccl': phase 'send' of the trainer (StalledTrainer, rank 0) "
                                        "did not finish within 0.5 s")
