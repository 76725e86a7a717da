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
    """The default: torchtrain's tensors served by the torchgen engines themselves."""
    plugin = plasmid_sync.plugin
    provider = "inprocess"
    shares = True
    extra_plugins = (plasmid_grpo_plugin, plasmid_torchtrain_plugin, plasmid_torchgen_plugin)

    def make_trainer(self, config):
        loss = testing.build("loss", "grpo", plasmid_grpo_plugin, config=config)
        return testing.build("trainer", "torchtrain", plasmid_torchtrain_plugin, config=config, args=(loss,))

    def make_engines(self, config, count):
        return [testing.build("engine", "torchgen", plasmid_torchgen_plugin, config=config) for _ in range(count)]


class TestInProcessSyncLlamaContract(TestInProcessSyncContract):
    model_options = {"arch": "llama", "tie_word_embeddings": False}
    engine_count = 1


class TestInProcessSyncCopyContract(TestInProcessSyncContract):
    config_options = {"inprocess_share_weights": "off"}
    shares = False


class TestInProcessSyncAsyncCopies(TestInProcessSyncContract):
    """Rollouts overlap training under --schedule async: engines must keep their own copy."""
    config_options = {"schedule": "async", "placement": "disaggregate"}
    engine_count = 1
    shares = False


def served_storages(engine) -> dict[str, int]:
    return {name: tensor.data_ptr() for name, tensor in engine._weights.tensors.items() if name in engine._weights.own}


def test_start_shares_the_trainers_tensors_so_the_engine_computes_with_every_update(tmp_path):
    from plasmid_torch.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny")
    config = testing.make_config(plasmid_sync.plugin, plasmid_grpo_plugin, plasmid_torchtrain_plugin,
                                 plasmid_torchgen_plugin, model=str(model), run_dir=tmp_path / "run", lr=1e-2)
    setup = TestInProcessSyncContract()
    sync = testing.build("weight_sync", "inprocess", plasmid_sync.plugin, config=config)
    trainer, (engine,) = setup.make_trainer(config), setup.make_engines(config, 1)
    live = dict(trainer.shared_weights())
    assert set(live) and all(served_storages(engine)[name] != t.data_ptr() for name, t in live.items())

    testing.run(sync.start(trainer, [engine]))
    served = served_storages(engine)
    assert all(served[name] == tensor.data_ptr() for name, tensor in live.items())   # the engine's copy is gone
    assert engine.weight_version == 0 and sync.shared_bytes == sum(t.numel() * 4 for t in live.values())

    name, tensor = next(iter(live.items()))
    with torch.no_grad():
        tensor.add_(1.0)                                                  # an optimizer step, in place
    got = testing.run(engine.get_weights([name]))[name]
    assert torch.equal(torch.from_numpy(got), tensor)
    report = testing.run(sync.sync(trainer, [engine], 1))
    assert (report.bytes, engine.weight_version) == (0, 1)
    testing.run(engine.shutdown())


def test_a_lora_trainer_is_copied_from_not_shared(tmp_path):
    pytest.importorskip("peft")
    from plasmid_torch.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny")
    config = testing.make_config(plasmid_sync.plugin, plasmid_grpo_plugin, plasmid_torchtrain_plugin,
                                 plasmid_torchgen_plugin, model=str(model), run_dir=tmp_path / "run", lora_rank=4,
                                 update_weight_buffer_size=40_000)
    setup = TestInProcessSyncContract()
    sync = testing.build("weight_sync", "inprocess", plasmid_sync.plugin, config=config)
    trainer, (engine,) = setup.make_trainer(config), setup.make_engines(config, 1)
    assert trainer.shared_weights() is None
    testing.run(sync.start(trainer, [engine]))
    report = testing.run(sync.sync(trainer, [engine], 1))
    assert report.bytes > 0 and report.buckets > 0 and sync.shared_bytes == 0
    testing.run(engine.shutdown())


@pytest.mark.parametrize("value", ["sometimes", "yes"])
def test_a_bad_share_weights_value_is_a_usage_error(value, capsys, tmp_path):
    from plasmid.app.cli import main

    code = main(["train", "--inprocess-share-weights", value, "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "--inprocess-share-weights" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()
