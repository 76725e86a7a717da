"""What the megatron trainer computes on one rank: the update, its metrics, accumulation, the LR
schedule, the reference model, skipped updates, resuming, and equality with the torch trainer."""

from __future__ import annotations

import importlib.util
import math
import random
from dataclasses import replace

import numpy as np
import plasmid_grpo.plugin
import plasmid_megatron.plugin
import pytest
import torch
from plasmid_megatron.trainer import MegatronTrainer, _explained

from plasmid import testing
from plasmid.errors import UsageError
from plasmid_torch.testing.contracts.trainer import exported, make_rollout_batch

VOCAB = 16


def config_for(model_dir, tmp_path, plugin=plasmid_megatron.plugin, trainer="megatron", **options):
    options = {"trainer": trainer, "lr": 1e-3, "model": str(model_dir), "run_dir": tmp_path / "run", **options}
    return testing.make_config(plugin, plasmid_grpo.plugin, **options)


@pytest.fixture
def make_trainer(model_dir, tmp_path):
    def factory(**options):
        config = config_for(model_dir, tmp_path, **options)
        loss = testing.build("loss", "grpo", plasmid_grpo.plugin, config=config)
        return testing.build("trainer", "megatron", plasmid_megatron.plugin, config=config, args=(loss,))

    return factory


def with_rollout_logprobs(trainer, batch, temperature=1.0):
    for sample, values in zip(batch.samples, testing.run(trainer.logprobs(batch.samples, temperature)), strict=True):
        sample.rollout_logprobs = values
    return batch


def close(a, b, atol=1e-6):
    return all(np.allclose(a[name], b[name], atol=atol, rtol=0) for name in a)


# ------------------------------------------------------------------------------------------------


def test_every_weight_moves_through_megatrons_main_grad(make_trainer):
    """DDP accumulates into param.main_grad; if the optimizer read param.grad nothing would move."""
    trainer = make_trainer()
    before = exported(trainer)
    metrics = testing.run(trainer.train_step(make_rollout_batch(VOCAB)))
    after = exported(trainer)
    unchanged = [name for name in before if np.array_equal(before[name], after[name])]
    assert not unchanged, f"weights that did not move: {unchanged}"
    assert metrics["train/grad_norm"] > 0 and metrics["train/skipped_updates"] == 0.0
    assert metrics["train/clip_frac"] == 0.0 and metrics["train/approx_kl"] == pytest.approx(0.0, abs=1e-7)


@pytest.mark.skipif(importlib.util.find_spec("plasmid_torchtrain") is None, reason="needs plasmid-torchtrain")
def test_first_update_equals_the_torch_trainers(model_dir, tmp_path, make_trainer):
    """Same model, batch, loss and Adam settings: megatron's loss, entropy and gradient norm equal
    the plain-PyTorch trainer's. (Weights are not compared: Adam's first step is lr * sign(grad) and
    turns float rounding of near-zero gradients into differences of up to lr.)"""
    import plasmid_torchtrain.plugin

    config = config_for(model_dir, tmp_path, plugin=plasmid_torchtrain.plugin, trainer="torchtrain")
    loss = testing.build("loss", "grpo", plasmid_grpo.plugin, config=config)
    torch_trainer = testing.build("trainer", "torchtrain", plasmid_torchtrain.plugin, config=config, args=(loss,))
    megatron_trainer = make_trainer(micro_batch_size=3)
    expected = testing.run(torch_trainer.train_step(make_rollout_batch(VOCAB)))
    got = testing.run(megatron_trainer.train_step(make_rollout_batch(VOCAB)))
    for name in ("train/loss", "train/pg_loss", "train/entropy", "train/grad_norm", "train/lr", "train/tokens"):
        assert got[name] == pytest.approx(expected[name], rel=1e-5, abs=1e-6), name


def test_micro_batches_and_token_budgets_accumulate_to_the_whole_batch(make_trainer):
    """With SGD (megatron's native --megatron-optimizer sgd) the new weights are linear in the
    gradient, so equal weights mean equal accumulated gradients."""
    results = []
    for options in ({"micro_batch_size": 256}, {"micro_batch_size": 3}, {"max_tokens_per_micro_batch": 20}):
        trainer = make_trainer(megatron_optimizer="sgd", lr=0.1, **options)
        results.append((testing.run(trainer.train_step(make_rollout_batch(VOCAB))), exported(trainer)))
    (whole, whole_weights), *others = results
    for metrics, weights in others:
        for name in ("train/loss", "train/pg_loss", "train/entropy", "train/grad_norm"):
            assert metrics[name] == pytest.approx(whole[name], rel=1e-5, abs=1e-6), name
        assert close(weights, whole_weights)


def test_global_batch_size_makes_one_update_per_chunk(make_trainer):
    trainer = make_trainer(global_batch_size=4, prompts_per_step=2, n_samples_per_prompt=4)
    metrics = testing.run(trainer.train_step(make_rollout_batch(VOCAB)))
    assert metrics["train/updates"] == 2.0 and trainer.updates == 2
    assert metrics["train/approx_kl"] > 0          # the second update starts from new weights


def test_learning_rate_warms_up_then_decays_per_update(make_trainer):
    trainer = make_trainer(lr_warmup_steps=2, lr_schedule="linear", num_rollouts=2, global_batch_size=4,
                           prompts_per_step=2, n_samples_per_prompt=4, min_lr=1e-4)
    rates = []
    for seed in range(2):
        testing.run(trainer.train_step(make_rollout_batch(VOCAB, seed=seed)))
        rates.append(trainer.optimizer.param_groups[0]["lr"])
    # 4 updates: warmup 0.5e-3, 1e-3; then decay reaches min_lr at the last update
    assert rates == pytest.approx([1e-3, 1e-4])


def test_kl_loss_builds_a_frozen_reference_and_reports_kl(make_trainer):
    trainer = make_trainer(kl_loss_coef=0.1)
    assert trainer.ref_model is not None
    reference_before = [p.detach().clone() for p in trainer.ref_model.parameters()]
    first = testing.run(trainer.train_step(make_rollout_batch(VOCAB)))
    second = testing.run(trainer.train_step(make_rollout_batch(VOCAB, seed=3)))
    assert first["train/kl"] == pytest.approx(0.0, abs=1e-7)
    assert second["train/kl"] > 0
    assert all(torch.equal(a, b) for a, b in zip(reference_before, trainer.ref_model.parameters(), strict=True))


def test_rollout_logprob_diff_is_zero_for_the_trainers_own_logprobs(make_trainer):
    trainer = make_trainer(temperature=0.8)
    batch = with_rollout_logprobs(trainer, make_rollout_batch(VOCAB), temperature=0.8)
    assert testing.run(trainer.train_step(batch))["train/train_rollout_logprob_abs_diff"] < 1e-6


class NanLoss:
    needs_ref = False
    needs_critic = False
    needs_old_logprobs = True

    def advantages(self, batch):
        return batch.response_mask.clone(), None

    def policy_loss(self, batch, logprobs, entropy):
        return (logprobs * batch.response_mask).sum() * math.nan, {}


def test_a_step_with_a_non_finite_loss_is_refused_with_the_weights_untouched(model_dir, tmp_path):
    trainer = MegatronTrainer(config_for(model_dir, tmp_path), NanLoss())
    before = exported(trainer)
    metrics = testing.run(trainer.train_step(make_rollout_batch(VOCAB)))
    assert metrics["train/bad_step/nonfinite_loss"] == 1.0 and metrics["train/updates"] == 0.0
    assert all(math.isfinite(value) for value in metrics.values())
    assert (trainer.steps, trainer.updates) == (0, 0)
    after = exported(trainer)
    assert all(np.array_equal(before[name], after[name]) for name in before)


def test_training_resumes_bit_identically_from_a_checkpoint(make_trainer, tmp_path):
    batches = [make_rollout_batch(VOCAB, seed=seed, rollout_id=seed) for seed in range(4)]
    options = dict(lr_schedule="cosine", lr_warmup_steps=1, num_rollouts=4, weight_decay=0.1)
    straight = make_trainer(**options)
    for batch in batches[:2]:
        testing.run(straight.train_step(batch))
    testing.run(straight.save(str(tmp_path / "ckpt")))
    for batch in batches[2:]:
        testing.run(straight.train_step(batch))

    resumed = make_trainer(**options)
    testing.run(resumed.load(str(tmp_path / "ckpt")))
    assert resumed.steps == 2 and resumed.updates == 2
    for batch in batches[2:]:
        testing.run(resumed.train_step(batch))
    a, b = exported(straight), exported(resumed)
    assert all(np.array_equal(a[name], b[name]) for name in a)


def test_load_restores_random_generator_states(make_trainer, tmp_path):
    trainer = make_trainer()
    testing.run(trainer.save(str(tmp_path / "ckpt")))
    expected = (torch.rand(3), random.random())
    testing.run(trainer.load(str(tmp_path / "ckpt")))
    assert torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1]


def test_checkpoint_layout(make_trainer, tmp_path):
    testing.run(make_trainer().save(str(tmp_path / "ckpt")))
    files = {p.name for p in (tmp_path / "ckpt" / "model").iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= files
    assert {"metadata.json", "common.pt"} <= {p.name for p in (tmp_path / "ckpt" / "dist").iterdir()}
    assert (tmp_path / "ckpt" / "rng" / "rank_00000.pt").is_file()
    assert not (tmp_path / "ckpt.tmp").exists() and not (tmp_path / "ckpt.old").exists()


def test_offload_and_onload_are_no_ops_on_cpu(make_trainer):
    trainer = make_trainer()
    samples = make_rollout_batch(VOCAB).samples
    before = testing.run(trainer.logprobs(samples, 1.0))
    testing.run(trainer.offload())
    testing.run(trainer.onload())
    assert testing.run(trainer.logprobs(samples, 1.0)) == before
    assert testing.run(trainer.train_step(make_rollout_batch(VOCAB)))["train/skipped_updates"] == 0.0


def test_empty_batch_makes_no_update(make_trainer):
    trainer = make_trainer()
    metrics = testing.run(trainer.train_step(replace(make_rollout_batch(VOCAB), groups=[])))
    assert metrics["train/samples"] == 0.0 and trainer.updates == 0


def test_a_sample_without_reward_is_an_error_that_names_it(make_trainer):
    batch = make_rollout_batch(VOCAB)
    batch.groups[1].samples[2].reward = None
    with pytest.raises(ValueError, match=r"sample 6 \(index 6, group 1\) has reward None"):
        testing.run(make_trainer().train_step(batch))


def test_a_critic_loss_without_value_loss_is_refused(model_dir, tmp_path):
    critic_loss = type("CriticLoss", (NanLoss,), {"needs_critic": True})()
    with pytest.raises(UsageError, match="needs a critic .* has no value_loss"):
        MegatronTrainer(config_for(model_dir, tmp_path), critic_loss)


def test_calling_cuda_without_it_becomes_an_explained_usage_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    def megatron_internals():
        raise AssertionError("Torch not compiled with CUDA enabled")

    with pytest.raises(UsageError, match="megatron-core needs CUDA here"):
        _explained(megatron_internals)
