"""Moving the trainer's weights into a vLLM server, against the kernel's weight-sync contract
(torchtrain trainer, the session's ``vllm`` engine), plus an exact check: after syncing a trainer
whose tied embedding is zero, every log-prob the server gives is ``-ln(16)``.

- plasmid-sync's ``inprocess``: ``engine.update_weights`` bucket by bucket of
  ``--update-weight-buffer-size`` bytes: the engine's tensor path (safetensors payloads through
  ``/collective_rpc`` into the model's ``load_weights``);
- ``vllm-disk``: versioned directories, loaded with vLLM's in-place ``reload_weights``;
- ``vllm-nccl``: NCCL broadcast through vLLM's weight-transfer engine; needs GPUs (skipped here).
"""

from __future__ import annotations

import plasmid_sync.plugin
import plasmid_vllm.plugin
import pytest
from vllm_test_support import gpu_available, reset

from plasmid_torch.testing.server_sync import ServerSyncContract

plasmid_grpo_plugin = pytest.importorskip("plasmid_grpo.plugin")
plasmid_torchtrain_plugin = pytest.importorskip("plasmid_torchtrain.plugin")


class VLLMSyncContract(ServerSyncContract):
    plugin = plasmid_vllm.plugin
    loss_plugin, trainer_plugin = plasmid_grpo_plugin, plasmid_torchtrain_plugin
    extra_plugins = (plasmid_grpo_plugin, plasmid_torchtrain_plugin, plasmid_sync.plugin)
    engine_count = 1

    @pytest.fixture(scope="class")
    @classmethod
    def model_dir(cls, tiny_qwen):
        return tiny_qwen

    @pytest.fixture(autouse=True)
    def _session_engine(self, engine, tiny_qwen):
        self.shared, self.model = engine, tiny_qwen

    def make_engines(self, config, count):
        assert count == 1
        return [self.shared]

    def close(self, setup):
        reset(self.shared, self.model)


class TestInProcessSyncIntoVLLM(VLLMSyncContract):
    plugin = plasmid_sync.plugin
    provider = "inprocess"
    extra_plugins = (plasmid_grpo_plugin, plasmid_torchtrain_plugin, plasmid_vllm.plugin)


class TestDiskSync(VLLMSyncContract):
    provider = "vllm-disk"


@pytest.mark.skipif(not gpu_available(), reason="vllm-nccl broadcasts over NCCL: it needs GPUs for the trainer and "
                    "a server started with --vllm-weight-transfer-config '{\"backend\": \"nccl\"}'")
class TestNCCLSync(VLLMSyncContract):
    provider = "vllm-nccl"
