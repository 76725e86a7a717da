"""plasmid-sync's ``delta`` sync: the weight-sync contract in one process, bit-exact reconstruction
over many updates, refusals of updates applied out of order or twice, and the bytes it saves."""

from __future__ import annotations

import json

import numpy as np
import plasmid_sync.plugin
import pytest
import torch
from plasmid_sync.delta import apply_update, byte_planes, checksum, from_byte_planes

from plasmid import testing
from plasmid_torch.testing.contracts.trainer import exported, make_rollout_batch
from plasmid_torch.testing.contracts.weightsync import WeightSyncContract

pytest.importorskip("zstandard")
plasmid_grpo_plugin = pytest.importorskip("plasmid_grpo.plugin")
plasmid_torchtrain_plugin = pytest.importorskip("plasmid_torchtrain.plugin")
plasmid_torchgen_plugin = pytest.importorskip("plasmid_torchgen.plugin")


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


class TestDeltaSyncContract(WeightSyncContract):
    """The torchtrain trainer and torchgen engines in this process, through compressed deltas."""

    plugin = plasmid_sync.plugin
    provider = "delta"
    compresses = True
    extra_plugins = (plasmid_grpo_plugin, plasmid_torchtrain_plugin, plasmid_torchgen_plugin)

    def make_trainer(self, config):
        loss = testing.build("loss", "grpo", plasmid_grpo_plugin, config=config)
        return testing.build("trainer", "torchtrain", plasmid_torchtrain_plugin, config=config, args=(loss,))

    def make_engines(self, config, count):
        return [testing.build("engine", "torchgen", plasmid_torchgen_plugin, config=config) for _ in range(count)]


class TestDeltaSyncLlamaContract(TestDeltaSyncContract):
    model_options = {"arch": "llama", "tie_word_embeddings": False}
    engine_count = 1


class TestDeltaSyncBf16Contract(TestDeltaSyncContract):
    """bfloat16 parameters in trainer and engines (``--precision bf16``): numpy has no bfloat16, so
    the delta works on the raw 16-bit patterns and rebuilds bfloat16 tensors bit for bit."""

    config_options = {"precision": "bf16"}
    engine_count = 1


def build(tmp_path, engines=2, **options):
    from plasmid_torch.tiny import build_tiny_model

    contract = TestDeltaSyncContract()
    model = build_tiny_model(tmp_path / "tiny")
    options = {"lr": 1e-3, "update_weight_buffer_size": 40_000, **options}
    config = testing.make_config(contract.plugin, *contract.extra_plugins, model=str(model), run_dir=tmp_path / "run",
                                 **options)
    sync = testing.build("weight_sync", "delta", contract.plugin, *contract.extra_plugins, config=config)
    return config, sync, contract.make_trainer(config), contract.make_engines(config, engines)


def updates(tmp_path):
    return sorted(p.name for p in (tmp_path / "run" / "weights" / "delta").iterdir())


def test_byte_planes_round_trip():
    raw = np.arange(24, dtype=np.uint8)
    assert byte_planes(raw, 4).tolist()[:6] == [0, 4, 8, 12, 16, 20]
    assert np.array_equal(from_byte_planes(byte_planes(raw, 4), 4), raw)


def test_many_updates_reconstruct_the_trainers_weights_bit_for_bit_and_save_bytes(tmp_path):
    # lr 1e-6 (the generic default; RL fine-tuning steps are small): float32 weights keep their
    # sign, exponent and upper mantissa bits, and the XOR planes of those bytes compress away
    _, sync, trainer, engines = build(tmp_path, sync_keep_versions=3, lr=1e-6)

    async def scenario():
        reports = []
        for version in range(1, 6):
            await trainer.train_step(make_rollout_batch(16, seed=version))
            reports.append(await sync.sync(trainer, engines, version))
        weights = exported(trainer)
        return reports, weights, [await engine.get_weights(list(weights)) for engine in engines]

    reports, weights, served = testing.run(scenario())
    for engine_weights in served:
        for name, value in weights.items():
            assert np.array_equal(engine_weights[name], value), name
    first, later = reports[0], reports[1:]
    assert updates(tmp_path) == ["000003.delta", "000004.delta", "000005.delta"]  # the full snapshot is pruned
    for report in later:
        assert report.metrics["sync/bytes_saved"] > 0
        assert report.bytes + report.metrics["sync/bytes_saved"] == report.metrics["sync/raw_bytes"]
        assert report.metrics["sync/compression_ratio"] > 1.8, "a small update should compress well"
        assert report.bytes < first.bytes
    assert all(r.metrics["sync/raw_bytes"] == first.metrics["sync/raw_bytes"] for r in reports)


def test_an_engine_without_the_base_gets_the_full_snapshot(tmp_path):
    config, sync, trainer, engines = build(tmp_path, engines=1)

    async def scenario():
        for version in (1, 2):
            await trainer.train_step(make_rollout_batch(16, seed=version))
            await sync.sync(trainer, engines, version)
        restarted = TestDeltaSyncContract().make_engines(config, 1)[0]
        await trainer.train_step(make_rollout_batch(16, seed=9))  # trained on, not yet synced (async schedule)
        report = await sync.sync(trainer, [restarted], 2)         # the restarted engine catches up to 2
        names = list(exported(trainer))
        return report, await engines[0].get_weights(names), await restarted.get_weights(names), restarted

    report, old, caught_up, restarted = testing.run(scenario())
    assert "000002.full" in updates(tmp_path)
    assert restarted.weight_version == 2 and report.bytes > 0
    for name, value in old.items():
        assert np.array_equal(caught_up[name], value), f"{name}: not the weights of version 2"


def test_an_update_applied_twice_or_out_of_order_is_refused(tmp_path):
    config, sync, trainer, engines = build(tmp_path, sync_keep_versions=5)
    root = tmp_path / "run" / "weights" / "delta"
    behind = TestDeltaSyncContract().make_engines(config, 1)[0]

    async def scenario():
        for version in (1, 2, 3):
            await trainer.train_step(make_rollout_batch(16, seed=version))
            await sync.sync(trainer, engines if version > 1 else [*engines, behind], version)
        twice = out_of_order = None
        try:
            await apply_update(engines[0], str(root / "000003.delta"))
        except ValueError as exc:
            twice = str(exc)
        try:
            await apply_update(behind, str(root / "000003.delta"))  # behind is at update 1
        except ValueError as exc:
            out_of_order = str(exc)
        return twice, out_of_order

    twice, out_of_order = testing.run(scenario())
    assert twice and "already applied" in twice and "update 3" in twice
    assert out_of_order and "out of order" in out_of_order and "builds on update 2" in out_of_order
    assert "this engine is at update 1" in out_of_order


def test_a_corrupted_delta_fails_its_checksum(tmp_path):
    config, sync, trainer, engines = build(tmp_path, engines=1)
    root = tmp_path / "run" / "weights" / "delta"
    spare = TestDeltaSyncContract().make_engines(config, 1)[0]

    async def scenario():
        await trainer.train_step(make_rollout_batch(16, seed=1))
        await sync.sync(trainer, [*engines, spare], 1)
        await trainer.train_step(make_rollout_batch(16, seed=2))
        await sync.sync(trainer, engines, 2)
        manifest = json.loads((root / "000002.delta" / "manifest.json").read_text())
        manifest["tensors"][0]["checksum"] = checksum(np.zeros(1))
        (root / "000002.delta" / "manifest.json").write_text(json.dumps(manifest))
        await apply_update(spare, str(root / "000002.delta"))

    with pytest.raises(ValueError, match="does not match its checksum"):
        testing.run(scenario())
