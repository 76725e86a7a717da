"""Every way of moving the trainer's weights into SGLang servers, against the kernel's weight-sync
contract (torchtrain trainer, two ``sglang`` engines of one server each), plus an exact check:
after syncing a trainer whose tied embedding is zero, every log-prob the servers give is
``-ln(16)``.

- ``sglang-tensor``: flattened buckets through ``/update_weights_from_tensor`` (one tensor per
  bucket on the wire, counted as ``sync/handles``);
- ``sglang-distributed``: a gloo group of the trainer and both servers, ``/update_weights_from_distributed``;
- ``sglang-disk``: versioned directories through ``/update_weights_from_disk``;
- plasmid-sync's ``inprocess``: ``engine.update_weights`` bucket by bucket (the engine's own tensor path).

Every one gets the whole contract: its deadline test freezes a server (``SIGSTOP``), so the sync's own
HTTP call hangs, and its misloading engine (:class:`NativeMisloadingEngine`) changes what the servers
hold after their own endpoints loaded it, which the loaded checksums (``/get_weights_by_name``) and the
read-back must catch.
"""

from __future__ import annotations

import plasmid_sglang.plugin
import plasmid_sync.plugin
import pytest
from sglang_test_support import reset

from plasmid.testing import run
from plasmid_torch.testing.server_sync import ServerSyncContract

plasmid_grpo_plugin = pytest.importorskip("plasmid_grpo.plugin")
plasmid_torchtrain_plugin = pytest.importorskip("plasmid_torchtrain.plugin")


class SGLangSyncContract(ServerSyncContract):
    plugin = plasmid_sglang.plugin
    loss_plugin, trainer_plugin = plasmid_grpo_plugin, plasmid_torchtrain_plugin
    extra_plugins = (plasmid_grpo_plugin, plasmid_torchtrain_plugin, plasmid_sync.plugin)
    engine_count = 2

    @pytest.fixture(scope="class")
    @classmethod
    def model_dir(cls, tiny_llama):
        return tiny_llama

    @pytest.fixture(autouse=True)
    def _session_engines(self, engines, tiny_llama):
        self.shared, self.model = engines, tiny_llama

    def make_engines(self, config, count):
        assert count <= len(self.shared)
        return self.shared[:count]

    def close(self, setup):
        for engine in setup.engines:
            reset(engine, self.model)

    def misloading_engine(self, setup, index):
        return NativeMisloadingEngine(setup.engines[index])


class NativeMisloadingEngine:
    """An SGLang engine whose servers hold other values than they were sent, whatever path loaded
    them: after each bucket they loaded through their own endpoints (``load_payload``: sglang-tensor;
    ``receive_bucket``: sglang-distributed), the bucket's tensors are read back, 1 is added to the
    first element of each, and that is loaded with the engine's ``update_weights``; tensors handed to
    ``update_weights`` itself get the same change. No ``load_weights_from_disk``, so a disk sync hands
    it the tensors it read."""

    def __init__(self, engine):
        self._engine = engine

    def __getattr__(self, name):
        if name in ("share_weights", "load_weights_from_disk"):
            raise AttributeError(name)
        return getattr(self._engine, name)

    async def load_payload(self, names, payload, weight_version, **options):
        await self._engine.load_payload(names, payload, weight_version, **options)
        await self._skew(names, weight_version)

    async def receive_bucket(self, group_name, description, load_format, weight_version):
        await self._engine.receive_bucket(group_name, description, load_format, weight_version)
        await self._skew([name for name, _, _ in description], weight_version)

    async def update_weights(self, named_tensors, weight_version):
        await self._engine.update_weights([(name, skewed(tensor)) for name, tensor in named_tensors], weight_version)

    async def _skew(self, names, weight_version):
        held = await self._engine.get_weights(names)
        await self._engine.update_weights([(name, skewed(held[name])) for name in names], weight_version)


def skewed(tensor):
    import torch

    value = torch.as_tensor(tensor).clone()
    value.view(-1)[0] += 1
    return value


class DropsItsExport:
    """For the syncs whose trainer side keeps an export (and the bucket CUDA IPC needs alive) between
    calls: the call that finds the export ended drops both, so a finished sync leaves neither."""

    def test_a_finished_sync_leaves_no_export_behind(self, setup):
        from plasmid_torch.tensors import PROCESS_STATE

        run(self.train_then_sync(setup, 1))
        assert setup.sync.key not in PROCESS_STATE and setup.sync.key + "/held" not in PROCESS_STATE


class TestTensorSync(DropsItsExport, SGLangSyncContract):
    provider = "sglang-tensor"

    def test_each_bucket_travels_as_one_flattened_tensor_and_the_report_counts_them(self, setup):
        report = run(self.train_then_sync(setup, 3))
        buckets = list(setup.trainer.export_weights(self.bucket_bytes))
        tensors = sum(len(bucket) for bucket in buckets)
        assert report.metrics["sync/buckets"] == report.buckets == len(buckets) > 1
        assert report.metrics["sync/tensors"] == tensors > len(buckets)
        assert report.metrics["sync/handles"] == len(buckets), "one tensor (one CUDA IPC handle) per bucket"


class TestDistributedSync(DropsItsExport, SGLangSyncContract):
    provider = "sglang-distributed"
    #: the trainer's rendezvous, left waiting on the frozen server, gives up soon after the test
    stuck_options = {"sglang_update_timeout": 5.0}


class TestDiskSync(SGLangSyncContract):
    provider = "sglang-disk"


class TestInProcessSyncIntoSGLang(SGLangSyncContract):
    plugin = plasmid_sync.plugin
    provider = "inprocess"
    extra_plugins = (plasmid_grpo_plugin, plasmid_torchtrain_plugin, plasmid_sglang.plugin)
