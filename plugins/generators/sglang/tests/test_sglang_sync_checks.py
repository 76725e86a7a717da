"""The check that ends a verifying SGLang sync, without servers: ``/get_weights_by_name``'s payload
and how its refusal reads, and ``sglang-tensor`` and ``sglang-distributed`` ending with
:meth:`SyncGuard.verify` (read-back where the engine can, the scored probe where SGLang's model class
cannot read weights back), a load past ``--sync-timeout`` and the loaded checksums. Stand-in engines
load the packed buckets in this process."""

from __future__ import annotations

import asyncio
import json
import time

import plasmid_sglang.plugin
import plasmid_sync.plugin
import pytest
from plasmid_sglang.requests import READBACK_REFUSED, readback_refused, weights_request

from plasmid import testing
from plasmid_torch.sync_guard import ReadBackUnsupported, SyncMismatch, SyncTimeout, loaded_checksum

torch = pytest.importorskip("torch")

VOCAB = 16


def test_get_weights_by_name_asks_for_every_row_of_the_tensor():
    assert weights_request("model.norm.weight", 32) == {"name": "model.norm.weight", "truncate_size": 32}


def test_only_sglangs_no_read_back_answer_counts_as_unsupported():
    answer = json.dumps({"object": "error", "message": READBACK_REFUSED, "code": 400})
    assert readback_refused(400, answer)
    assert not readback_refused(500, answer)
    assert not readback_refused(400, '{"message": "Field required: name"}')
    assert not readback_refused(200, "[[0.1, 0.2]]")


def logprob(token, position):
    return -0.1 * (token + 1) - 0.01 * position


class Trainer:
    def export_weights(self, bucket_bytes):
        yield [("model.norm.weight", torch.ones(4)), ("lm_head.weight", torch.zeros(VOCAB, 4))]

    async def logprobs(self, samples, temperature):
        return [[logprob(t, i) for i, t in enumerate(s.tokens[s.prompt_length:])] for s in samples]


class Engine:
    """What the syncs call on an SGLang engine, in this process; ``get_weights`` refuses as SGLang
    does for a Qwen2 model; ``offset`` shifts its log-probs (it serves other weights)."""

    def __init__(self, offset=0.0):
        self.offset, self.loaded, self.probed = offset, [], 0

    def check_description(self, description):
        return [name for name, _, _ in description]

    async def load_payload(self, names, payload, weight_version, restorable=False):
        self.loaded.append((names, weight_version))

    async def flush_cache(self):
        return None

    async def get_weights(self, names):
        raise ReadBackUnsupported("server 0: /get_weights_by_name: SGLang cannot read this model class's weights back")

    async def response_logprobs(self, token_ids, prompt_length, temperature):
        self.probed += 1
        return [logprob(t, i) + self.offset for i, t in enumerate(token_ids[prompt_length:])]


@pytest.fixture
def model(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": VOCAB}))
    return tmp_path


def tensor_sync(model, tmp_path, **options):
    config = testing.make_config(plasmid_sglang.plugin, plasmid_sync.plugin, model=str(model),
                                 run_dir=tmp_path / "run", **options)
    return testing.build("weight_sync", "sglang-tensor", plasmid_sglang.plugin, plasmid_sync.plugin, config=config)


def test_a_verifying_sync_probes_an_engine_that_cannot_read_back(model, tmp_path):
    engines = [Engine(), Engine()]
    report = testing.run(tensor_sync(model, tmp_path, verify_sync_every=1).sync(Trainer(), engines, 3))
    assert all(engine.loaded == [(["model.norm.weight", "lm_head.weight"], 3)] for engine in engines)
    assert report.metrics["sync/probed_engines"] == 2.0 and report.metrics["sync/probe_max_diff"] == 0.0
    assert all(engine.probed > 0 for engine in engines)


def test_a_verifying_sync_fails_when_the_probe_differs(model, tmp_path):
    with pytest.raises(SyncMismatch, match=r"weight sync 'sglang-tensor': the probe's log-probs from engine 1 "):
        testing.run(tensor_sync(model, tmp_path, verify_sync_every=1).sync(Trainer(), [Engine(), Engine(0.5)], 1))


def test_other_syncs_do_not_check(model, tmp_path):
    engine = Engine(offset=0.5)
    report = testing.run(tensor_sync(model, tmp_path, verify_sync_every=2).sync(Trainer(), [engine], 1))
    assert engine.probed == 0 and "sync/probed_engines" not in report.metrics


def test_sglang_distributed_is_guarded_too(model, tmp_path):
    config = testing.make_config(plasmid_sglang.plugin, plasmid_sync.plugin, model=str(model), run_dir=tmp_path / "run")
    sync = testing.build("weight_sync", "sglang-distributed", plasmid_sglang.plugin, plasmid_sync.plugin,
                         config=config)
    assert sync.guard.transport == "sglang-distributed" and sync.guard.options.verify_sync_every == 50


class SlowEngine(Engine):
    """An engine whose load does not return for ``seconds`` (a server that stopped answering)."""

    def __init__(self, seconds):
        super().__init__()
        self.seconds = seconds

    async def load_payload(self, names, payload, weight_version, restorable=False):
        await asyncio.sleep(self.seconds)


def test_a_load_past_sync_timeout_is_one_error_naming_phase_engine_and_rank(model, tmp_path):
    sync = tensor_sync(model, tmp_path, sync_timeout=0.5, verify_sync_every=0)
    began = time.perf_counter()
    with pytest.raises(SyncTimeout) as raised:
        testing.run(sync.sync(Trainer(), [Engine(), SlowEngine(30)], 1))
    assert time.perf_counter() - began < 5, "the sync waited for the engine, not for its deadline"
    assert str(raised.value).startswith("weight sync 'sglang-tensor': phase 'load' of engine 1 (SlowEngine, rank 2) "
                                        "did not finish within 0.5 s (--sync-timeout")


def test_a_load_within_sync_timeout_passes(model, tmp_path):
    sync = tensor_sync(model, tmp_path, sync_timeout=5.0, verify_sync_every=0)
    assert testing.run(sync.sync(Trainer(), [SlowEngine(0.2)], 1)).buckets == 1


class HoldingEngine(Engine):
    """An engine that reports CRC32s of what it holds (``loaded_checksums``): what it was sent, plus
    ``skew`` on every value."""

    def __init__(self, skew=0.0):
        super().__init__()
        self.skew, self.held, self.asked = skew, {}, []

    async def load_payload(self, names, payload, weight_version, restorable=False):
        for name, tensor in next(iter(Trainer().export_weights(0))):
            self.held[name] = tensor + self.skew

    async def loaded_checksums(self, requests):
        self.asked.append(list(requests))
        return {name: loaded_checksum(self.held[name][:rows] if rows else self.held[name]) for name, rows in requests}


def test_each_bucket_is_checked_against_the_checksums_the_engine_reports(model, tmp_path):
    engine = HoldingEngine()
    report = testing.run(tensor_sync(model, tmp_path, verify_sync_every=0).sync(Trainer(), [engine], 4))
    assert report.metrics["sync/loaded_checksums"] == 1.0 and len(engine.asked) == 1
    ((name, rows),) = engine.asked[0]
    assert (name, rows) in (("model.norm.weight", 4), ("lm_head.weight", VOCAB))


def test_an_engine_holding_other_values_is_refused(model, tmp_path):
    with pytest.raises(SyncMismatch, match=r"weight sync 'sglang-tensor': tensor '[^']+' loaded by engine 0 "
                       r"\(HoldingEngine, rank 1\) has CRC32 [0-9a-f]{8} .*\(--sync-checksums\)"):
        testing.run(tensor_sync(model, tmp_path, verify_sync_every=0).sync(Trainer(), [HoldingEngine(1e-3)], 1))
