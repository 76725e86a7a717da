"""plasmid-sync's ``disk`` sync: the weight-sync contract in one process, and its directory layout."""

from __future__ import annotations

import json

import plasmid_sync.plugin
import pytest
import torch

from plasmid import testing
from plasmid_torch.disk_sync import DiskSyncOptions, prune_versions, version_dir
from plasmid_torch.testing.contracts.trainer import make_rollout_batch
from plasmid_torch.testing.contracts.weightsync import WeightSyncContract

plasmid_grpo_plugin = pytest.importorskip("plasmid_grpo.plugin")
plasmid_torchtrain_plugin = pytest.importorskip("plasmid_torchtrain.plugin")
plasmid_torchgen_plugin = pytest.importorskip("plasmid_torchgen.plugin")


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


class TestDiskSyncContract(WeightSyncContract):
    """The torchtrain trainer and torchgen engines in this process, through the disk."""

    plugin = plasmid_sync.plugin
    provider = "disk"
    extra_plugins = (plasmid_grpo_plugin, plasmid_torchtrain_plugin, plasmid_torchgen_plugin)

    def make_trainer(self, config):
        loss = testing.build("loss", "grpo", plasmid_grpo_plugin, config=config)
        return testing.build("trainer", "torchtrain", plasmid_torchtrain_plugin, config=config, args=(loss,))

    def make_engines(self, config, count):
        return [testing.build("engine", "torchgen", plasmid_torchgen_plugin, config=config) for _ in range(count)]

    async def sync_with_corrupted_bucket(self, setup, weight_version):
        """Sync once, flip a byte in the data of the version's first shard, sync the same version
        again (engines reload the directory: a restarted engine catching up)."""
        await setup.sync.sync(setup.trainer, setup.engines, weight_version)
        directory = version_dir(DiskSyncOptions.of(setup.config).root(setup.config.run_dir), weight_version)
        flip_a_data_byte(sorted(directory.glob("*.safetensors"))[0])
        return await setup.sync.sync(setup.trainer, setup.engines, weight_version)


def flip_a_data_byte(path):
    """Invert one byte in the middle of a safetensors file's tensor data (after its JSON header)."""
    raw = bytearray(path.read_bytes())
    data_start = 8 + int.from_bytes(raw[:8], "little")
    raw[(data_start + len(raw)) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))


class TestDiskSyncLlamaContract(TestDiskSyncContract):
    model_options = {"arch": "llama", "tie_word_embeddings": False}
    engine_count = 1


def build(tmp_path, **options):
    from plasmid_torch.tiny import build_tiny_model

    contract = TestDiskSyncContract()
    model = build_tiny_model(tmp_path / "tiny")
    config = testing.make_config(contract.plugin, *contract.extra_plugins, model=str(model), run_dir=tmp_path / "run",
                                 lr=1e-2, update_weight_buffer_size=40_000, **options)
    sync = testing.build("weight_sync", "disk", contract.plugin, *contract.extra_plugins, config=config)
    return config, sync, contract.make_trainer(config), contract.make_engines(config, 1)


def test_a_version_is_a_loadable_hugging_face_model_directory_in_shards(tmp_path):
    import transformers

    _, sync, trainer, engines = build(tmp_path)

    async def scenario():
        await trainer.train_step(make_rollout_batch(16))
        return await sync.sync(trainer, engines, 5)

    report = testing.run(scenario())
    directory = version_dir(tmp_path / "run" / "weights", 5)
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) == report.buckets > 1 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert not list(directory.parent.glob("*.tmp-*")), "a staging directory was left behind"
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(directory))
    trained = dict(trainer.model.state_dict())
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, trained[name]), name


def test_only_the_newest_versions_are_kept(tmp_path):
    _, sync, trainer, engines = build(tmp_path, sync_keep_versions=2)

    async def scenario():
        for version in (1, 2, 3):
            await trainer.train_step(make_rollout_batch(16))
            await sync.sync(trainer, engines, version)

    testing.run(scenario())
    assert sorted(p.name for p in (tmp_path / "run" / "weights").iterdir()) == ["v2", "v3"]
    assert prune_versions(tmp_path / "run" / "weights", 1) == [tmp_path / "run" / "weights" / "v2"]


def test_syncing_a_written_version_again_reloads_it_without_rewriting(tmp_path):
    config, sync, trainer, engines = build(tmp_path)

    async def scenario():
        await trainer.train_step(make_rollout_batch(16))
        first = await sync.sync(trainer, engines, 1)
        written = (version_dir(tmp_path / "run" / "weights", 1) / "plasmid_weights.json").stat().st_mtime_ns
        await trainer.train_step(make_rollout_batch(16, seed=3))  # the trainer moved on (async schedule)
        fresh = TestDiskSyncContract().make_engines(config, 1)     # a restarted engine catches up
        again = await sync.sync(trainer, fresh, 1)
        names = [name for bucket in trainer.export_weights(10**9) for name, _ in bucket][:3]
        return first, again, written, await engines[0].get_weights(names), await fresh[0].get_weights(names)

    first, again, written, old_engine, caught_up = testing.run(scenario())
    assert again.bytes == first.bytes
    assert (version_dir(tmp_path / "run" / "weights", 1) / "plasmid_weights.json").stat().st_mtime_ns == written
    for name, value in old_engine.items():
        assert (caught_up[name] == value).all(), f"{name}: the restarted engine did not get version 1"
