"""The trainers' shared options (plasmid_torch.trainer_options) and what is derived from them."""

from __future__ import annotations

import pytest

from plasmid import hookimpl, testing
from plasmid.errors import UsageError
from plasmid.kernel_options import RolloutOptions
from plasmid_torch.trainer_options import TrainerOptions
from plasmid_torch.training import scheduled_updates, updates_per_rollout


class DeclaresTrainerOptions:
    """A stand-in trainer plugin: declares the shared options, as every trainer plugin does."""

    @hookimpl
    def plasmid_addoption(self, parser):
        parser.add_options(TrainerOptions)


def test_defaults_are_typed_and_the_critic_lr_follows_the_lr():
    options = TrainerOptions.defaults()
    assert options.global_batch_size is None and options.micro_batch_size == 256
    assert options.critic_lr is None and options.critic_learning_rate == options.lr == 1e-6
    assert TrainerOptions.from_values({"lr": 3e-4}).critic_learning_rate == 3e-4
    assert TrainerOptions.from_values({"lr": 3e-4, "critic_lr": 1e-3}).critic_learning_rate == 1e-3


def test_a_config_reads_them_from_the_declaring_plugin():
    config = testing.make_config(DeclaresTrainerOptions(), lr=2e-4, global_batch_size=16)
    options = TrainerOptions.of(config)
    assert (options.lr, options.global_batch_size, options.critic_learning_rate) == (2e-4, 16, 2e-4)


@pytest.mark.parametrize(("options", "flag"), [
    ({"critic_warmup_steps": -1}, "--critic-warmup-steps"),
    ({"critic_lr": 0.0}, "--critic-lr"),
    ({"min_lr": -1.0}, "--min-lr"),
    ({"lr_warmup_steps": -2}, "--lr-warmup-steps"),
])
def test_a_bad_value_is_a_usage_error_naming_the_flag(options, flag):
    with pytest.raises(UsageError, match=flag):
        testing.make_config(DeclaresTrainerOptions(), **options)


def test_updates_per_rollout_is_one_per_global_batch_of_the_steps_samples():
    rollout = RolloutOptions.from_values({"prompts_per_step": 4, "n_samples_per_prompt": 5, "num_rollouts": 3})
    assert updates_per_rollout(TrainerOptions.defaults(), rollout) == 1
    assert updates_per_rollout(TrainerOptions.from_values({"global_batch_size": 8}), rollout) == 3   # 20 samples
    assert updates_per_rollout(TrainerOptions.from_values({"global_batch_size": 64}), rollout) == 1
    assert scheduled_updates(TrainerOptions.from_values({"global_batch_size": 8}), rollout) == 9
