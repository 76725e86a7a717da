"""Refused steps with several data-parallel ranks (gloo, two processes): a NaN loss on one rank
only, or a weight check that fails on one rank only, refuses the step on every rank, so the
ranks' weights never diverge; the next good step trains on both alike."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

WORLD = 2


def _digest(trainer) -> str:
    digest = hashlib.sha256()
    for bucket in trainer.export_weights(1 << 30):
        for name, tensor in bucket:
            digest.update(name.encode())
            digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()


def _rank(rank: int, model_dir: str, store: str, out: str) -> None:
    import plasmid_torchtrain.plugin
    import torch.distributed as dist

    from plasmid import testing
    from plasmid_torch.testing.contracts.trainer import PoisonableLoss, bad_reasons, make_rollout_batch

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        vocab = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]
        loss = PoisonableLoss()
        config = testing.make_config(plasmid_torchtrain.plugin, model=model_dir, run_dir=Path(out) / "run",
                                     lr=1e-3, micro_batch_size=2)
        trainer = testing.build("trainer", "torchtrain", plasmid_torchtrain.plugin, config=config, args=(loss,))
        assert trainer.dp.world == WORLD
        start = _digest(trainer)
        loss.poisoned = rank == 1                            # this rank's shard only
        poisoned = testing.run(trainer.train_step(make_rollout_batch(vocab, seed=1)))
        after_poison = _digest(trainer)
        loss.poisoned = False
        agreed = trainer.dp.any(rank == 1), trainer.dp.any(False)
        good = testing.run(trainer.train_step(make_rollout_batch(vocab, seed=2)))
        result = {"reasons": bad_reasons(poisoned), "unchanged": after_poison == start, "agreed": agreed,
                  "good_reasons": bad_reasons(good), "after_good": _digest(trainer), "moved": _digest(trainer) != start,
                  "counters": (trainer.steps, trainer.updates)}
        (Path(out) / f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(600)
def test_a_nan_loss_on_one_rank_refuses_the_step_on_every_rank(tmp_path, monkeypatch):
    from plasmid_torch.tiny import build_tiny_model

    model_dir = build_tiny_model(tmp_path / "tiny")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # pytest imports this file as plugins.trainers.torchtrain.tests...: the spawned ranks unpickle
    # _rank by that name, so they need the repository root on their path (spawn passes sys.path on)
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[4]))
    mp.spawn(_rank, args=(str(model_dir), str(tmp_path / "store"), str(tmp_path)), nprocs=WORLD, join=True)
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(WORLD)]
    for result in ranks:
        assert result["reasons"] == ["nonfinite_loss"], result
        assert result["unchanged"], "a refused step changed a rank's weights"
        assert result["agreed"] == [True, False], "DataParallel.any must be the same on every rank"
        assert result["good_reasons"] == [] and result["moved"]
        assert result["counters"] == [1, 1]
    assert ranks[0]["after_good"] == ranks[1]["after_good"], "the ranks diverged"
