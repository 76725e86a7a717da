"""The check that ends a verifying ``vllm-nccl`` sync, without servers or a GPU: whether a server can
read its weights back (only with plasmid's worker extension: vLLM has no API for it), and the sync
ending with :meth:`SyncGuard.verify`, which probes an engine that cannot. The stand-in trainer
answers the NCCL broadcast itself (it needs CUDA and vLLM's transfer engine)."""

from __future__ import annotations

import json

import plasmid_sync.plugin
import plasmid_vllm.plugin
import pytest
from plasmid_vllm.server import WORKER_EXTENSION, has_weight_readback, server_values
from plasmid_vllm.syncs import send_over_nccl

from plasmid import testing
from plasmid_torch.sync_guard import SyncMismatch

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


def nccl_sync(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": VOCAB}))
    config = testing.make_config(plasmid_vllm.plugin, plasmid_sync.plugin, model=str(tmp_path),
                                 run_dir=tmp_path / "run", verify_sync_every=1)
    return testing.build("weight_sync", "vllm-nccl", plasmid_vllm.plugin, plasmid_sync.plugin, config=config)


def test_a_verifying_nccl_sync_probes_an_engine_without_read_back(tmp_path):
    engine = Engine()
    report = testing.run(nccl_sync(tmp_path).sync(Trainer(), [engine], 4))
    assert engine.updates == [(4, "vllm-nccl")]
    assert report.metrics == {"sync/probed_engines": 1.0, "sync/probe_max_diff": 0.0}


def test_a_verifying_nccl_sync_fails_when_the_engine_serves_other_weights(tmp_path):
    with pytest.raises(SyncMismatch, match=r"weight sync 'vllm-nccl': the probe's log-probs from engine 0 \(Engine"):
        testing.run(nccl_sync(tmp_path).sync(Trainer(), [Engine(offset=0.1)], 1))
