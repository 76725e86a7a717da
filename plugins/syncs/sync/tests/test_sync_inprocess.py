"""plasmid-sync's ``inprocess`` sync against the weight-sync contract, moving weights from the
torchtrain trainer into two torchgen engines in this process."""

from __future__ import annotations

import plasmid_sync.plugin
import pytest
import torch

from plasmid import testing
from plasmid_torch.testing.contracts.weightsync import WeightSyncContract

plasmid_grpo_plugin = pytest.importorskip("plasmid_grpo.plugin")
plasmid_torchtrain_plugin = pytest.importorskip("plasmid_torchtrain.plugin")
plasmid_torchgen_plugin = pytest.importorskip("plasmid_torchgen.plugin")


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


class TestInProcessSyncContract(WeightSyncContract):
    plugin = plasmid_sync.plugin
    provider = "inprocess"
    extra_plugins = (plasmid_grpo_plugin, plasmid_torchtrain_plugin, plasmid_torchgen_plugin)

    def make_trainer(self, config):
        loss = testing.build("loss", "grpo", plasmid_grpo_plugin, config=config)
        return testing.build("trainer", "torchtrain", plasmid_torchtrain_plugin, config=config, args=(loss,))

    def make_engines(self, config, count):
        return [testing.build("engine", "torchgen", plasmid_torchgen_plugin, config=config) for _ in range(count)]


class TestInProcessSyncLlamaContract(TestInProcessSyncContract):
    model_options = {"arch": "llama", "tie_word_embeddings": False}
    engine_count = 1
