"""FSDP2 with two CPU ranks (gloo): the sharded trainer's losses, gradient norms and updated
weights equal one process training the same batches (the ranks make the same forward calls, which
are collectives); a checkpoint saved by the two ranks resumes in one process (resharded by
torch.distributed.checkpoint) and continues as the one process did. And replicated ranks
(``--torchtrain-sharding replicate``), whose samples share their group's prompt pass, update as
one process does."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

WORLD = 2
OPTIONS = {"lr": 1e-2, "micro_batch_size": 2}
#: the sharded and the single run sum gradients in different orders; AdamW divides by sqrt(v), so an
#: element whose gradient is float noise moves by up to lr: measured max |difference| 1.04e-5 after two
#: steps at lr 1e-2 (torch 2.13, CPU), so 5e-5 (0.5% of one step); losses and grad norms agree to 1e-5
WEIGHT_ATOL = 5e-5


def batch(seed: int):
    from plasmid_torch.testing.contracts.trainer import make_rollout_batch

    # 9 samples: shards of 5 and 4, so rank 1 runs one empty micro-batch to match rank 0's forwards
    return make_rollout_batch(16, groups=3, group_size=3, seed=seed)


def build(model_dir: str, run_dir: Path, **options):
    import plasmid_torchtrain.plugin

    from plasmid import testing
    from plasmid_torch.testing.contracts.trainer import ContractLoss

    config = testing.make_config(plasmid_torchtrain.plugin, model=model_dir, run_dir=run_dir, **OPTIONS, **options)
    return testing.build("trainer", "torchtrain", plasmid_torchtrain.plugin, config=config, args=(ContractLoss(),))


def exported(trainer) -> dict[str, torch.Tensor]:
    return {name: tensor for bucket in trainer.export_weights(1 << 12) for name, tensor in bucket}


def picked(metrics: dict[str, float]) -> dict[str, float]:
    return {name: metrics[name] for name in ("train/loss", "train/grad_norm", "train/pg_loss")}


def _rank(rank: int, model_dir: str, store: str, out: str, sharding: str) -> None:
    """One rank: a step on ``batch(1)`` (its policy's forward calls recorded in ``calls<rank>.json``);
    with FSDP2 also a checkpoint and a step on ``batch(2)``. Rank 0 writes the weights and metrics."""
    import torch.distributed as dist

    from plasmid import testing

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        # the FSDP2 ranks pack their micro-batches; the replicated ones are checked sharing prompt passes
        trainer = build(model_dir, Path(out) / "run", torchtrain_sharding=sharding,
                        torchtrain_packing=sharding == "fsdp")
        kind = (type(trainer).__name__, getattr(trainer, "collective", False),
                type(next(trainer.model.parameters())).__name__)
        rows = []       # the policy's forward calls: the samples of each (packed into one row or padded)
        hook = trainer.model.register_forward_pre_hook(
            lambda module, args, kwargs: rows.append(len(kwargs["cu_seq_lens_q"]) - 1 if "cu_seq_lens_q" in kwargs
                                                     else len(kwargs["input_ids"])), with_kwargs=True)
        metrics = [picked(testing.run(trainer.train_step(batch(1))))]
        hook.remove()
        (Path(out) / f"calls{rank}.json").write_text(json.dumps(rows))
        if sharding == "fsdp":
            testing.run(trainer.save(str(Path(out) / "ckpt")))
            metrics.append(picked(testing.run(trainer.train_step(batch(2)))))
        weights = exported(trainer)
        if rank == 0:
            torch.save(weights, Path(out) / "weights.pt")
            (Path(out) / "result.json").write_text(json.dumps({"kind": kind, "metrics": metrics}))
    finally:
        dist.destroy_process_group()


def _spawn(tmp_path: Path, monkeypatch, sharding: str) -> tuple[str, dict]:
    """Two ranks of :func:`_rank` on a fresh tiny model: ``(its directory, rank 0's result)``."""
    from plasmid_torch.tiny import build_tiny_model

    torch.set_num_threads(1)
    model_dir = str(build_tiny_model(tmp_path / "tiny"))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[4]))   # see test_torchtrain_bad_steps
    mp.spawn(_rank, args=(model_dir, str(tmp_path / "store"), str(tmp_path), sharding), nprocs=WORLD, join=True)
    return model_dir, json.loads((tmp_path / "result.json").read_text())


@pytest.mark.timeout(600)
def test_two_fsdp_ranks_train_save_and_resume_in_one_process_as_one_process_trains(tmp_path, monkeypatch):
    from plasmid import testing

    model_dir, result = _spawn(tmp_path, monkeypatch, "fsdp")
    assert result["kind"] == ["ShardedTorchTrainer", True, "DTensor"]
    # every forward call is a collective: the ranks make the same ones, one pass per micro-batch (no
    # second pass on a KV cache for a group's prompt, TorchTrainer._shares; a packed pass may hold a
    # shared prompt once, so it counts sequences, not samples); rank 1's last micro-batch is empty
    # and runs row 0 (shards of 5 and 4 samples, micro-batches of 2): 3 micro-batches, 2 passes each
    calls = [json.loads((tmp_path / f"calls{rank}.json").read_text()) for rank in range(WORLD)]
    assert len(calls[0]) == len(calls[1]) == 6 and max(calls[0] + calls[1]) <= 2

    alone = build(model_dir, tmp_path / "alone")
    assert type(alone).__name__ == "TorchTrainer"
    expected = [picked(testing.run(alone.train_step(batch(seed)))) for seed in (1, 2)]
    for sharded, single in zip(result["metrics"], expected, strict=True):
        assert sharded == pytest.approx(single, rel=1e-5, abs=1e-7)
    sharded_weights, single_weights = torch.load(tmp_path / "weights.pt"), exported(alone)
    assert list(sharded_weights) == list(single_weights)              # the same names, tied once
    for name, tensor in single_weights.items():
        torch.testing.assert_close(sharded_weights[name], tensor, rtol=0, atol=WEIGHT_ATOL, msg=name)

    resumed = build(model_dir, tmp_path / "resumed")                  # one rank reads two ranks' shards
    testing.run(resumed.load(str(tmp_path / "ckpt")))
    assert (tmp_path / "ckpt" / "model" / "config.json").is_file()
    assert picked(testing.run(resumed.train_step(batch(2)))) == pytest.approx(expected[1], rel=1e-5, abs=1e-7)
    for name, tensor in exported(resumed).items():
        torch.testing.assert_close(tensor, single_weights[name], rtol=0, atol=WEIGHT_ATOL, msg=name)


@pytest.mark.timeout(600)
def test_replicated_ranks_share_prompt_passes_and_update_as_one_process(tmp_path, monkeypatch):
    from plasmid import testing

    model_dir, result = _spawn(tmp_path, monkeypatch, "replicate")
    assert result["kind"] == ["TorchTrainer", False, "Parameter"]
    # rank 0's first micro-batch is two samples of one group: one prompt row, then their responses
    calls = json.loads((tmp_path / "calls0.json").read_text())
    assert calls[0] == 1 and calls[1] == 2

    alone = build(model_dir, tmp_path / "alone")
    assert result["metrics"][0] == pytest.approx(picked(testing.run(alone.train_step(batch(1)))), rel=1e-5, abs=1e-7)
    replicated = torch.load(tmp_path / "weights.pt")
    for name, tensor in exported(alone).items():
        torch.testing.assert_close(replicated[name], tensor, rtol=0, atol=WEIGHT_ATOL, msg=name)
