"""Every way of moving the trainer's weights into SGLang servers, against the kernel's weight-sync
contract (torchtrain trainer, two ``sglang`` engines of one server each), plus an exact check:
after syncing a trainer whose tied embedding is zero, every log-prob the servers give is
``-ln(16)``.

- ``sglang-tensor``: flattened buckets through ``/update_weights_from_tensor`` (one tensor per
  bucket on the wire, counted as ``sync/handles``);
- ``sglang-distributed``: a gloo group of the trainer and both servers, ``/update_weights_from_distributed``;
- ``sglang-disk``: versioned directories through ``/update_weights_from_disk``;
- plasmid-sync's ``inprocess``: ``engine.update_weights`` bucket by bucket (the engine's own tensor path).
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


#: Why two contract checks do not apply to SGLang's own syncs yet (issue 37): they load through the
#: server's /update_weights_from_tensor and /update_weights_from_distributed, which the contract's
#: stuck and misloading stand-ins (wrapping update_weights and load_weights_from_disk) never see, and
#: their phases have no deadline yet; the scored probe, which reads what the engine serves, checks them
NATIVE_LOAD_GAP = ("sglang's native load path has no phase deadlines yet and bypasses the contract's stuck and "
                   "misloading stand-ins; the scored probe test covers what it loaded")


class NativeLoadGaps:
    """The two contract checks :data:`NATIVE_LOAD_GAP` explains, skipped with that reason."""

    @pytest.mark.skip(reason=NATIVE_LOAD_GAP)
    def test_a_stuck_engine_fails_within_the_deadline(self):
        pass

    @pytest.mark.skip(reason=NATIVE_LOAD_GAP)
    def test_an_engine_that_loads_other_values_is_caught_by_read_back(self):
        pass


class TestTensorSync(NativeLoadGaps, SGLangSyncContract):
    provider = "sglang-tensor"

    def test_each_bucket_travels_as_one_flattened_tensor_and_the_report_counts_them(self, setup):
        report = run(self.train_then_sync(setup, 3))
        buckets = list(setup.trainer.export_weights(self.bucket_bytes))
        tensors = sum(len(bucket) for bucket in buckets)
        assert report.metrics["sync/buckets"] == report.buckets == len(buckets) > 1
        assert report.metrics["sync/tensors"] == tensors > len(buckets)
        assert report.metrics["sync/handles"] == len(buckets), "one tensor (one CUDA IPC handle) per bucket"


class TestDistributedSync(NativeLoadGaps, SGLangSyncContract):
    provider = "sglang-distributed"


class TestDiskSync(SGLangSyncContract):
    provider = "sglang-disk"


class TestInProcessSyncIntoSGLang(SGLangSyncContract):
    plugin = plasmid_sync.plugin
    provider = "inprocess"
    extra_plugins = (plasmid_grpo_plugin, plasmid_torchtrain_plugin, plasmid_sglang.plugin)
