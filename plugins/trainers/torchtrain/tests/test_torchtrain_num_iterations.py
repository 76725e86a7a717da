"""``--num-iterations N`` on the torch trainer: N passes over one rollout's samples against the old
log-probs taken once before the first pass, so from the second pass the PPO ratio moves away from 1
and its clip acts (:class:`plasmid_torch.train_step.TrainStep`)."""

from __future__ import annotations

from dataclasses import replace

import plasmid_grpo.plugin
import plasmid_torchtrain.plugin
import torch

from plasmid import testing
from plasmid_torch.testing.contracts.trainer import make_rollout_batch

VOCAB = 16


def trainer_with(model_dir, tmp_path, **options):
    options = {"model": str(model_dir), "run_dir": tmp_path / "run", "micro_batch_size": 3, **options}
    config = testing.make_config(plasmid_torchtrain.plugin, plasmid_grpo.plugin, **options)
    loss = testing.build("loss", "grpo", plasmid_grpo.plugin, config=config)
    trainer = testing.build("trainer", "torchtrain", plasmid_torchtrain.plugin, config=config, args=(loss,))
    trainer.updates_seen = []
    update = trainer.recipe.parts.policy_update

    def recorded(batch, inputs, chunk, **fill):
        metrics = update(batch, inputs, chunk, **fill)
        trainer.updates_seen.append((batch.old_logprobs.clone(), metrics))
        return metrics

    trainer.no_grad_passes = 0
    logprobs = trainer.recipe.parts.logprobs

    def counted(model, inputs, temperature):
        trainer.no_grad_passes += 1
        return logprobs(model, inputs, temperature)

    trainer.recipe.parts = replace(trainer.recipe.parts, policy_update=recorded, logprobs=counted)
    return trainer


def rewarded_batch():
    batch = make_rollout_batch(VOCAB)
    for position, sample in enumerate(batch.samples):
        sample.reward = float(position % 3)
    return batch


def test_the_second_pass_sees_a_ratio_away_from_1_and_clips_at_a_large_lr(model_dir, tmp_path):
    trainer = trainer_with(model_dir, tmp_path, lr=1e-2, num_iterations=2)
    assert not trainer.recipe.reuses_update_forward(2), "old log-probs need their own pass before the first"
    metrics = testing.run(trainer.train_step(rewarded_batch()))
    # one no-grad pass for the old log-probs, then two passes of one update each (how many forward
    # calls each makes depends on the pass batching picks: packed, or a prompt's KV cache shared)
    assert trainer.no_grad_passes == 1 and len(trainer.updates_seen) == 2
    (old_first, first), (old_second, second) = trainer.updates_seen
    assert torch.equal(old_first, old_second), "the old log-probs are taken once, before the first pass"
    assert first["approx_kl"] == 0.0 and first["clip_frac"] == 0.0, "on-policy: the first pass's ratio is 1"
    assert second["approx_kl"] > 1e-4 and second["clip_frac"] > 0.0
    assert metrics["train/updates"] == 2.0 and trainer.updates == 2 and trainer.steps == 1
    assert metrics["train/clip_frac"] == second["clip_frac"], "the last pass's clip fraction"


def test_passes_multiply_the_updates_of_a_global_batch_and_the_schedule(model_dir, tmp_path):
    trainer = trainer_with(model_dir, tmp_path, lr=1e-3, num_iterations=3, global_batch_size=4,
                           lr_schedule="linear", num_rollouts=2, prompts_per_step=2, n_samples_per_prompt=4)
    metrics = testing.run(trainer.train_step(rewarded_batch()))
    assert metrics["train/updates"] == 6.0 and trainer.updates == 6
    # the linear schedule runs over 2 rollouts x 2 updates x 3 passes = 12 updates: 6 made
    assert abs(metrics["train/lr"] - 1e-3 * (1 - 5 / 12)) < 1e-12


def test_the_weight_check_bounds_the_move_of_every_pass_together(model_dir, tmp_path):
    trainer = trainer_with(model_dir, tmp_path, lr=5e-2, num_iterations=2)
    metrics = testing.run(trainer.train_step(rewarded_batch()))
    assert len(trainer.updates_seen) == 2, "the first pass alone stays within --max-update-ratio"
    assert metrics["train/bad_step/weights_blew_up"] == 1.0 and metrics["train/updates"] == 0.0
    assert (trainer.steps, trainer.updates) == (0, 0)
