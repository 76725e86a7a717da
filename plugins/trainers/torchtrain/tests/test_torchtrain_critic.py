"""The torch trainer's critic, grown when the loss needs one (PPO): values, warm-up, checkpoints."""

from __future__ import annotations

import math

import numpy as np
import plasmid_grpo.plugin
import plasmid_ppo.plugin
import plasmid_torchtrain.plugin
import pytest
import torch
from plasmid_torchtrain.critic import CRITIC_FILE

from plasmid import testing
from plasmid.errors import UsageError
from plasmid_torch.testing.contracts.trainer import TrainerContract, exported, make_rollout_batch

VOCAB = 16


@pytest.fixture
def make_trainer(model_dir, tmp_path):
    def factory(**options):
        options = {"lr": 1e-3, "critic_lr": 2e-3, "model": str(model_dir), "run_dir": tmp_path / "run", **options}
        config = testing.make_config(plasmid_torchtrain.plugin, plasmid_ppo.plugin, **options)
        loss = testing.build("loss", "ppo", plasmid_ppo.plugin, config=config)
        return testing.build("trainer", "torchtrain", plasmid_torchtrain.plugin, config=config, args=(loss,))

    return factory


def critic_weights(trainer) -> dict[str, np.ndarray]:
    return {name: tensor.detach().numpy().copy() for name, tensor in trainer.critic.state_dict().items()}


def test_ppo_step_trains_policy_and_critic_and_reports_critic_metrics(make_trainer):
    trainer = make_trainer()
    policy_before, critic_before = exported(trainer), critic_weights(trainer)
    metrics = testing.run(trainer.train_step(make_rollout_batch(VOCAB)))
    assert metrics["train/value_mean"] == 0.0              # the value head starts at zero
    for name in ("value_loss", "value_clip_frac", "value_pred_mean", "explained_variance", "returns_mean",
                 "critic_grad_norm", "critic_lr", "pg_loss", "clip_frac", "approx_kl"):
        assert math.isfinite(metrics[f"train/{name}"]), name
    assert metrics["train/critic_lr"] == 2e-3 and metrics["train/lr"] == 1e-3
    assert metrics["train/policy_updated"] == 1.0
    assert any(not np.array_equal(policy_before[n], v) for n, v in exported(trainer).items())
    assert any(not np.array_equal(critic_before[n], v) for n, v in critic_weights(trainer).items())


def test_values_are_read_where_each_response_token_is_predicted(make_trainer):
    trainer = make_trainer()
    with torch.no_grad():
        trainer.critic.value_head.bias.fill_(0.1)
        trainer.critic.value_head.weight.normal_(0.0, 0.1)
    samples = make_rollout_batch(VOCAB).samples
    values = testing.run(trainer.values(samples))
    for sample, got in zip(samples, values, strict=True):
        with torch.no_grad():
            every_position = trainer.critic(torch.tensor([sample.tokens]), torch.ones(1, len(sample.tokens)))[0]
        # the state before response token t is position prompt_length - 1 + t
        expected = every_position[sample.prompt_length - 1: len(sample.tokens) - 1]
        assert torch.allclose(torch.tensor(got), expected, atol=1e-5)


def test_the_critic_learns_the_returns_of_a_repeated_batch(make_trainer):
    trainer = make_trainer(critic_warmup_steps=100)
    batch = make_rollout_batch(VOCAB)
    losses = [testing.run(trainer.train_step(batch))["train/value_loss"] for _ in range(12)]
    assert max(losses[-3:]) < 0.6 * losses[0], losses


def test_warmup_steps_train_only_the_critic(make_trainer):
    trainer = make_trainer(critic_warmup_steps=1)
    before = exported(trainer)
    metrics = testing.run(trainer.train_step(make_rollout_batch(VOCAB)))
    assert metrics["train/policy_updated"] == 0.0 and metrics["train/updates"] == 0.0
    assert "train/pg_loss" not in metrics and math.isfinite(metrics["train/value_loss"])
    assert all(np.array_equal(before[n], v) for n, v in exported(trainer).items()), "the policy moved in warm-up"
    metrics = testing.run(trainer.train_step(make_rollout_batch(VOCAB, seed=1)))
    assert metrics["train/policy_updated"] == 1.0
    assert any(not np.array_equal(before[n], v) for n, v in exported(trainer).items())


def test_ppo_keeps_the_policy_frozen_for_every_warmup_step(make_trainer):
    trainer = make_trainer(critic_warmup_steps=3)
    before = exported(trainer)
    for step in range(3):
        metrics = testing.run(trainer.train_step(make_rollout_batch(VOCAB, seed=step, rollout_id=step)))
        assert metrics["train/policy_updated"] == 0.0 and metrics["train/updates"] == 0.0, step
    assert all(np.array_equal(before[n], v) for n, v in exported(trainer).items()), "the policy moved in warm-up"
    assert trainer.updates == 0 and trainer.steps == 3
    metrics = testing.run(trainer.train_step(make_rollout_batch(VOCAB, seed=3, rollout_id=3)))
    assert metrics["train/policy_updated"] == 1.0 and metrics["train/updates"] == 1.0 and trainer.updates == 1


def test_a_loss_without_a_critic_trains_the_policy_from_the_first_step_whatever_the_warmup(model_dir, tmp_path):
    """--critic-warmup-steps only concerns losses with a critic: GRPO's policy is updated in step 0."""
    config = testing.make_config(plasmid_torchtrain.plugin, plasmid_grpo.plugin, model=str(model_dir), lr=1e-3,
                                 critic_warmup_steps=3, run_dir=tmp_path / "run")
    loss = testing.build("loss", "grpo", plasmid_grpo.plugin, config=config)
    trainer = testing.build("trainer", "torchtrain", plasmid_torchtrain.plugin, config=config, args=(loss,))
    before = exported(trainer)
    metrics = testing.run(trainer.train_step(make_rollout_batch(VOCAB)))
    assert metrics["train/updates"] == 1.0 and trainer.updates == 1
    assert "train/policy_updated" not in metrics           # reported only by trainers with a critic
    assert any(not np.array_equal(before[n], v) for n, v in exported(trainer).items()), "GRPO's policy did not move"


def test_checkpoint_restores_the_critic_and_its_optimizer(make_trainer, tmp_path):
    trained = make_trainer()
    testing.run(trained.train_step(make_rollout_batch(VOCAB, seed=1)))
    testing.run(trained.save(str(tmp_path / "ckpt")))
    assert (tmp_path / "ckpt" / CRITIC_FILE).is_file()
    samples = make_rollout_batch(VOCAB, seed=2).samples

    fresh = make_trainer()
    testing.run(fresh.load(str(tmp_path / "ckpt")))
    assert testing.run(fresh.values(samples)) == testing.run(trained.values(samples))
    # the next step continues identically: the critic's optimizer state came back too
    next_batch = make_rollout_batch(VOCAB, seed=3)
    testing.run(trained.train_step(next_batch))
    testing.run(fresh.train_step(make_rollout_batch(VOCAB, seed=3)))
    assert testing.run(fresh.values(samples)) == testing.run(trained.values(samples))


def test_values_without_a_critic_is_an_error(model_dir, tmp_path):
    config = testing.make_config(plasmid_torchtrain.plugin, plasmid_grpo.plugin, model=str(model_dir),
                                 run_dir=tmp_path / "run")
    loss = testing.build("loss", "grpo", plasmid_grpo.plugin, config=config)
    trainer = testing.build("trainer", "torchtrain", plasmid_torchtrain.plugin, config=config, args=(loss,))
    assert trainer.critic is None
    with pytest.raises(ValueError, match="no critic"):
        testing.run(trainer.values(make_rollout_batch(VOCAB).samples))


def test_a_critic_loss_without_value_loss_is_a_usage_error(model_dir, tmp_path):
    config = testing.make_config(plasmid_torchtrain.plugin, plasmid_grpo.plugin, model=str(model_dir),
                                 run_dir=tmp_path / "run")

    class HalfCritic:
        needs_ref, needs_critic, needs_old_logprobs = False, True, True

    with pytest.raises(UsageError, match="value_loss"):
        testing.build("trainer", "torchtrain", plasmid_torchtrain.plugin, config=config, args=(HalfCritic(),))


class TestTorchtrainWithPpoContract(TrainerContract):
    """The trainer contract holds with a critic, too."""

    plugin = plasmid_torchtrain.plugin
    provider = "torchtrain"
    loss_plugin = plasmid_ppo.plugin
    loss_provider = "ppo"
