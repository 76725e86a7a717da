"""Every way of moving the trainer's weights into SGLang servers, against the kernel's weight-sync
contract (torchtrain trainer, two ``sglang`` engines of one server each), plus an exact check:
after syncing a trainer whose tied embedding is zero, every log-prob the servers give is
``-ln(16)``.

- ``sglang-tensor``: flattened buckets through ``/update_weights_from_tensor``;
- ``sglang-distributed``: a gloo group of the trainer and both servers, ``/update_weights_from_distributed``;
- ``sglang-disk``: versioned directories through ``/update_weights_from_disk``;
- plasmid-sync's ``inprocess``: ``engine.update_weights`` bucket by bucket (the engine's own tensor path).
"""

from __future__ import annotations

import math

import plasmid_sglang.plugin
import plasmid_sync.plugin
import pytest
import torch
from sglang_test_support import reset

from plasmid import testing
from plasmid_torch.testing.contracts.weightsync import WeightSyncContract

plasmid_grpo_plugin = pytest.importorskip("plasmid_grpo.plugin")
plasmid_torchtrain_plugin = pytest.importorskip("plasmid_torchtrain.plugin")


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


class SGLangSyncContract(WeightSyncContract):
    plugin = plasmid_sglang.plugin
    extra_plugins = (plasmid_grpo_plugin, plasmid_torchtrain_plugin, plasmid_sync.plugin)
    engine_count = 2

    @pytest.fixture(scope="class")
    @classmethod
    def model_dir(cls, tiny_llama):
        return tiny_llama

    @pytest.fixture(autouse=True)
    def _session_engines(self, engines, tiny_llama):
        self.shared, self.model = engines, tiny_llama

    def make_trainer(self, config):
        loss = testing.build("loss", "grpo", plasmid_grpo_plugin, config=config)
        return testing.build("trainer", "torchtrain", plasmid_torchtrain_plugin, config=config, args=(loss,))

    def make_engines(self, config, count):
        assert count <= len(self.shared)
        return self.shared[:count]

    def close(self, setup):
        for engine in setup.engines:
            reset(engine, self.model)

    def test_a_trainer_with_a_zero_embedding_makes_every_logprob_uniform(self, setup):
        with torch.no_grad():
            setup.trainer.model.get_input_embeddings().weight.zero_()

        async def scenario():
            report = await setup.sync.sync(setup.trainer, setup.engines, 6)
            scored = [await engine.score([1, 4, 5, 6, 7, 8], 2, temperature) for engine in setup.engines
                      for temperature in (1.0, 0.7)]
            return report, scored

        report, scored = testing.run(scenario())
        assert report.weight_version == 6 and all(engine.weight_version == 6 for engine in setup.engines)
        for values in scored:
            assert len(values) == 4 and max(abs(v + math.log(16)) for v in values) < 1e-6


class TestTensorSync(SGLangSyncContract):
    provider = "sglang-tensor"


class TestDistributedSync(SGLangSyncContract):
    provider = "sglang-distributed"


class TestDiskSync(SGLangSyncContract):
    provider = "sglang-disk"


class TestInProcessSyncIntoSGLang(SGLangSyncContract):
    plugin = plasmid_sync.plugin
    provider = "inprocess"
    extra_plugins = (plasmid_grpo_plugin, plasmid_torchtrain_plugin, plasmid_sglang.plugin)
