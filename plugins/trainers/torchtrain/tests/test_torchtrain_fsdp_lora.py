"""LoRA (--lora-rank) on two FSDP2 ranks (gloo): the sharded trainer's losses, gradient norms and
trained adapters equal one process training the same batches, only the adapters change, the engine
(torchgen) scores the merged weights the two ranks export as the trainer does, and a checkpoint of
the two ranks (adapters in peft's format and in dcp/, merged weights in model/) resumes in one
process, and the one process's checkpoint resumes on the two ranks, each continuing as the one process did."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

pytest.importorskip("peft")
WORLD = 2
OPTIONS = {"lr": 1e-2, "micro_batch_size": 2, "lora_rank": 4}
#: the reference is the base model with the adapters disabled: kl_coef > 0 makes the loss use it
KL_COEF = 0.1
#: as in test_torchtrain_fsdp: the ranks sum gradients in another order than one process, and AdamW
#: moves an element whose gradient is float noise by up to lr; losses and grad norms agree to 1e-5.
#: Measured after two steps (torch 2.13, CPU): adapters max |difference| 3.3e-6, merged weights 2.6e-7,
#: the engine's log-probs after the sync against the two ranks' 4.8e-7
WEIGHT_ATOL = 5e-5


def batch(seed: int):
    from plasmid_torch.testing.contracts.trainer import make_rollout_batch

    # 9 samples: shards of 5 and 4, so rank 1 runs one empty micro-batch to match rank 0's forwards
    return make_rollout_batch(16, groups=3, group_size=3, seed=seed)


def build(model_dir: str, run_dir: Path, seed: int = 0):
    import plasmid_torchtrain.plugin

    from plasmid import testing
    from plasmid_torch.testing.contracts.trainer import ContractLoss

    torch.manual_seed(seed)     # peft draws lora_A from the global generator: each rank draws others
    config = testing.make_config(plasmid_torchtrain.plugin, model=model_dir, run_dir=run_dir, **OPTIONS)
    return testing.build("trainer", "torchtrain", plasmid_torchtrain.plugin, config=config,
                         args=(ContractLoss(kl_coef=KL_COEF),))


def exported(trainer) -> dict[str, torch.Tensor]:
    return {name: tensor for bucket in trainer.export_weights(1 << 12) for name, tensor in bucket}


def parameters(trainer) -> dict[str, torch.Tensor]:
    """Every parameter of the peft model, whole (a collective call on a sharded trainer)."""
    from plasmid_torchtrain.distributed import full

    with torch.no_grad():
        return {name: full(p).detach().clone() for name, p in trainer.model.named_parameters()}


def picked(metrics: dict[str, float]) -> dict[str, float]:
    return {name: metrics[name] for name in ("train/loss", "train/grad_norm", "train/pg_loss", "train/kl")}


def _rank(rank: int, model_dir: str, store: str, out: str) -> None:
    import torch.distributed as dist
    from plasmid_torchtrain.lora import adapter_state

    from plasmid import testing

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        trainer = build(model_dir, Path(out) / "run", seed=rank)     # rank 0's adapters must reach rank 1
        kind = (type(trainer).__name__, type(trainer.ref_model).__name__,
                type(next(p for p in trainer.model.parameters() if p.requires_grad)).__name__)
        before = parameters(trainer)
        first = picked(testing.run(trainer.train_step(batch(1))))
        testing.run(trainer.save(str(Path(out) / "ckpt")))
        second = picked(testing.run(trainer.train_step(batch(2))))
        written = trainer.save_adapters(str(Path(out) / "adapters"))     # what --weight-sync vllm-lora sends
        result = {"before": before, "after": parameters(trainer), "merged": exported(trainer),
                  "adapters": adapter_state(trainer.model),
                  "scores": testing.run(trainer.logprobs(batch(5).samples, 1.0))}
        again = build(model_dir, Path(out) / "again", seed=rank + 7)    # one process's checkpoint, on two ranks
        testing.run(again.load(str(Path(out) / "alone-ckpt")))
        third = picked(testing.run(again.train_step(batch(2))))
        result["resumed_adapters"] = adapter_state(again.model)
        if rank == 0:
            torch.save(result, Path(out) / "weights.pt")
            (Path(out) / "result.json").write_text(json.dumps({"kind": kind, "metrics": [first, second, third],
                                                               "adapter_bytes": written}))
    finally:
        dist.destroy_process_group()


def engine_scores(model_dir: str, run_dir: Path, merged: dict[str, torch.Tensor], samples) -> list[list[float]]:
    """torchgen's log-probs of ``samples`` after a sync of the weights ``merged``."""
    import plasmid_torchgen.plugin
    from plasmid_torchtrain.weights import buckets

    from plasmid import testing

    config = testing.make_config(plasmid_torchgen.plugin, model=model_dir, run_dir=run_dir)
    engine = testing.build("engine", "torchgen", plasmid_torchgen.plugin, config=config)

    async def sync_and_score():
        for bucket in buckets(merged.items(), 1 << 12):
            await engine.update_weights(bucket, 1)
        return await asyncio.gather(*(engine.score(s.tokens, s.prompt_length, 1.0) for s in samples))

    try:
        return testing.run(sync_and_score())
    finally:
        testing.run(engine.shutdown())


@pytest.mark.timeout(600)
def test_lora_on_two_fsdp_ranks_trains_syncs_and_resumes_as_one_process(tmp_path, monkeypatch):
    pytest.importorskip("plasmid_torchgen.plugin")
    from plasmid_torchtrain.lora import adapter_state

    from plasmid import testing
    from plasmid_torch.hf import load_causal_lm
    from plasmid_torch.tiny import build_tiny_model

    torch.set_num_threads(1)
    model_dir = str(build_tiny_model(tmp_path / "tiny"))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[4]))   # see test_torchtrain_bad_steps
    alone = build(model_dir, tmp_path / "alone")
    assert type(alone).__name__ == "TorchTrainer"
    expected = [picked(testing.run(alone.train_step(batch(1))))]
    testing.run(alone.save(str(tmp_path / "alone-ckpt")))
    expected.append(picked(testing.run(alone.train_step(batch(2)))))
    mp.spawn(_rank, args=(model_dir, str(tmp_path / "store"), str(tmp_path)), nprocs=WORLD, join=True)
    result = json.loads((tmp_path / "result.json").read_text())
    sharded = torch.load(tmp_path / "weights.pt")
    assert result["kind"] == ["ShardedTorchTrainer", "AdaptersDisabled", "DTensor"]

    # only the adapters changed, and they did
    adapters = [name for name in sharded["before"] if "lora_" in name]
    assert adapters and len(adapters) < len(sharded["before"])
    for name, tensor in sharded["before"].items():
        if name not in adapters:
            assert torch.equal(sharded["after"][name], tensor), f"frozen base weight {name} changed"
    assert all(not torch.equal(sharded["after"][name], sharded["before"][name])
               for name in adapters if ".lora_B." in name)       # lora_B starts at 0: every one moved

    assert expected[1]["train/kl"] > 0
    # the third: two ranks resuming the one process's step-1 checkpoint and training step 2
    for got, single in zip(result["metrics"], [*expected, expected[1]], strict=True):
        assert got == pytest.approx(single, rel=1e-5, abs=1e-7)
    single_adapters = adapter_state(alone.model)
    assert list(sharded["adapters"]) == list(single_adapters) == adapters
    for name, tensor in single_adapters.items():
        torch.testing.assert_close(sharded["adapters"][name], tensor, rtol=0, atol=WEIGHT_ATOL, msg=name)
        torch.testing.assert_close(sharded["resumed_adapters"][name], tensor, rtol=0, atol=WEIGHT_ATOL, msg=name)
    single_merged = exported(alone)
    assert list(sharded["merged"]) == list(single_merged)            # the base model's HF names, tied once
    for name, tensor in single_merged.items():
        torch.testing.assert_close(sharded["merged"][name], tensor, rtol=0, atol=WEIGHT_ATOL, msg=name)

    # the engine, synced with the merged weights the two ranks exported, scores as the two ranks do
    samples = batch(5).samples
    scored = engine_scores(model_dir, tmp_path / "engine", sharded["merged"], samples)
    for mine, theirs in zip(sharded["scores"], scored, strict=True):
        assert mine == pytest.approx(theirs, abs=1e-5)

    # the adapters alone (save_adapters, every rank calling it): peft loads them as the ranks held them
    from peft import PeftModel

    loaded = PeftModel.from_pretrained(load_causal_lm(model_dir), str(tmp_path / "adapters")).state_dict()
    assert result["adapter_bytes"] == sum(t.numel() * t.element_size() for t in sharded["adapters"].values())
    for name, tensor in sharded["adapters"].items():
        assert torch.equal(loaded[name], tensor), name

    # the two ranks' checkpoint: peft adapters, merged HF weights, dcp/ that one process resumes
    ckpt = tmp_path / "ckpt"
    assert (ckpt / "adapter" / "adapter_model.safetensors").is_file() and (ckpt / "dcp").is_dir()
    resumed = build(model_dir, tmp_path / "resumed")
    testing.run(resumed.load(str(ckpt)))
    saved = load_causal_lm(str(ckpt / "model")).state_dict()
    for name, tensor in exported(resumed).items():          # model/ holds the step-1 merged weights
        torch.testing.assert_close(saved[name], tensor, rtol=0, atol=1e-6, msg=name)
    assert picked(testing.run(resumed.train_step(batch(2)))) == pytest.approx(expected[1], rel=1e-5, abs=1e-7)
    for name, tensor in adapter_state(resumed.model).items():
        torch.testing.assert_close(tensor, single_adapters[name], rtol=0, atol=WEIGHT_ATOL, msg=name)
