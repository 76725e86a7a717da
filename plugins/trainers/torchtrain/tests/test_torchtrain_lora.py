"""LoRA through peft (--lora-rank): only the adapters train, the reference is the base model with
the adapters disabled, weight syncs send merged weights (the engine's log-probs after a sync equal
the trainer's), checkpoints hold the adapters and resume."""

from __future__ import annotations

import asyncio

import plasmid_torchtrain.plugin
import pytest
import torch

from plasmid import testing
from plasmid.errors import UsageError
from plasmid_torch.hf import load_causal_lm
from plasmid_torch.testing.contracts.trainer import ContractLoss, make_rollout_batch

pytest.importorskip("peft")
VOCAB = 16


def make_trainer(model_dir, tmp_path, loss=None, **options):
    options = {"lr": 1e-2, "model": str(model_dir), "run_dir": tmp_path / "run", "lora_rank": 4, **options}
    config = testing.make_config(plasmid_torchtrain.plugin, **options)
    return testing.build("trainer", "torchtrain", plasmid_torchtrain.plugin, config=config,
                         args=(loss or ContractLoss(),))


def exported(trainer):
    return {name: tensor for bucket in trainer.export_weights(1 << 12) for name, tensor in bucket}


def test_only_the_adapters_train_and_the_export_is_the_merged_model(model_dir, tmp_path):
    trainer = make_trainer(model_dir, tmp_path)
    frozen = {name: p.detach().clone() for name, p in trainer.model.named_parameters() if not p.requires_grad}
    adapters = {name: p.detach().clone() for name, p in trainer.model.named_parameters() if p.requires_grad}
    assert adapters and all("lora_" in name for name in adapters)
    assert sum(len(group["params"]) for group in trainer.optimizer.param_groups) == len(adapters)
    base = {name: tensor.clone() for name, tensor in exported(trainer).items()}
    plain = load_causal_lm(str(model_dir))
    assert list(base) == [name for name in plain.state_dict() if name != "lm_head.weight" or
                          not plain.config.tie_word_embeddings]
    for name, tensor in base.items():          # lora_B starts at zero: the merged model is the base model
        assert torch.equal(tensor, plain.state_dict()[name]), name
    for step in range(2):
        metrics = testing.run(trainer.train_step(make_rollout_batch(VOCAB, seed=step)))
        assert not [name for name in metrics if "bad_step" in name]
    for name, p in trainer.model.named_parameters():
        if name in frozen:
            assert torch.equal(p, frozen[name]), f"frozen base weight {name} changed"
    assert any(not torch.equal(p, adapters[name]) for name, p in trainer.model.named_parameters() if name in adapters)
    after = exported(trainer)
    changed = sorted(name for name in after if not torch.equal(after[name], base[name]))
    assert changed and all(name.endswith("proj.weight") for name in changed), changed


def test_the_engine_scores_the_synced_merged_weights_as_the_trainer_does(model_dir, tmp_path):
    plasmid_torchgen_plugin = pytest.importorskip("plasmid_torchgen.plugin")
    trainer = make_trainer(model_dir, tmp_path)
    for step in range(2):
        testing.run(trainer.train_step(make_rollout_batch(VOCAB, seed=step)))
    config = testing.make_config(plasmid_torchgen_plugin, model=str(model_dir), run_dir=tmp_path / "engine")
    engine = testing.build("engine", "torchgen", plasmid_torchgen_plugin, config=config)
    samples = make_rollout_batch(VOCAB, seed=5).samples

    async def sync_and_score():
        for bucket in trainer.export_weights(1 << 12):
            await engine.update_weights(bucket, 1)
        return await asyncio.gather(*(engine.score(s.tokens, s.prompt_length, 1.0) for s in samples))

    try:
        scored = testing.run(sync_and_score())
    finally:
        testing.run(engine.shutdown())
    trained = testing.run(trainer.logprobs(samples, 1.0))
    for mine, theirs in zip(trained, scored, strict=True):
        assert mine == pytest.approx(theirs, abs=1e-5)
    base_scores = [testing.run(trainer.logprobs([s], 1.0))[0] for s in samples[:1]]
    assert base_scores[0] == pytest.approx(trained[0], abs=1e-6)


def test_the_reference_is_the_base_model_with_the_adapters_disabled(model_dir, tmp_path):
    trainer = make_trainer(model_dir, tmp_path, loss=ContractLoss(kl_coef=0.1))
    assert type(trainer.ref_model).__name__ == "AdaptersDisabled"
    for step in range(2):
        metrics = testing.run(trainer.train_step(make_rollout_batch(VOCAB, seed=step)))
    assert metrics["train/kl"] > 0                       # the policy moved away from its reference
    padded = trainer._pad(make_rollout_batch(VOCAB, seed=7).samples)
    reference = trainer._no_grad_logprobs(trainer.ref_model, padded, 1.0)
    from plasmid_torchtrain.batching import response_logprobs

    with torch.no_grad():
        base, _ = response_logprobs(load_causal_lm(str(model_dir)), padded, 1.0)
    torch.testing.assert_close(reference, base, atol=1e-6, rtol=0)


def test_a_checkpoint_holds_the_adapters_and_resumes_them(model_dir, tmp_path):
    trainer = make_trainer(model_dir, tmp_path)
    testing.run(trainer.train_step(make_rollout_batch(VOCAB, seed=0)))
    testing.run(trainer.save(str(tmp_path / "ckpt")))
    assert (tmp_path / "ckpt" / "adapter" / "adapter_model.safetensors").is_file()
    merged = load_causal_lm(str(tmp_path / "ckpt" / "model"))     # a complete HF model: the merged weights
    for name, tensor in exported(trainer).items():
        assert torch.equal(merged.state_dict()[name], tensor), name
    resumed = make_trainer(model_dir, tmp_path / "again")
    testing.run(resumed.load(str(tmp_path / "ckpt")))
    first = testing.run(trainer.train_step(make_rollout_batch(VOCAB, seed=1)))
    second = testing.run(resumed.train_step(make_rollout_batch(VOCAB, seed=1)))
    assert first["train/loss"] == second["train/loss"] and first["train/grad_norm"] == second["train/grad_norm"]
    for (name, a), (_, b) in zip(exported(trainer).items(), exported(resumed).items(), strict=True):
        assert torch.equal(a, b), name
    assert (tmp_path / "ckpt" / "dcp").is_dir()                 # adapters and AdamW state, for any number of ranks
    full_training = make_trainer(model_dir, tmp_path / "full", lora_rank=0)
    with pytest.raises(ValueError, match=r"holds LoRA adapters .* --lora-rank") as failure:
        testing.run(full_training.load(str(tmp_path / "ckpt")))
    assert "\n" not in str(failure.value)


def test_bad_target_modules_are_a_one_line_error(model_dir, tmp_path):
    with pytest.raises(UsageError, match=r"^torchtrain: --lora-target-modules no_such_proj: ") as failure:
        make_trainer(model_dir, tmp_path, lora_target_modules=("no_such_proj",))
    assert "\n" not in str(failure.value)
