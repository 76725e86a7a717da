"""plasmid-torchtrain declares the trainers' shared options (TrainerOptions) and reads them typed."""

from __future__ import annotations

import plasmid_torchtrain.plugin
import pytest
from plasmid_torchtrain.trainer import TorchTrainer

from plasmid import testing
from plasmid.config import OptionParser
from plasmid.errors import UsageError
from plasmid_torch.trainer_options import TrainerOptions


def test_the_plugin_declares_the_trainer_options():
    parser = OptionParser()
    testing.make_manager(plasmid_torchtrain.plugin).addoption(parser)
    assert TrainerOptions in parser.option_classes
    assert set(TorchTrainer.option_classes) <= set(parser.option_classes)


def test_typed_reads_give_the_declared_defaults():
    options = TrainerOptions.of(testing.make_config(plasmid_torchtrain.plugin))
    assert (options.lr, options.micro_batch_size, options.clip_grad) == (1e-6, 256, 1.0)
    assert options.global_batch_size is None and options.critic_warmup_steps == 0
    assert options.critic_learning_rate == 1e-6


@pytest.mark.parametrize(("options", "flag"), [
    ({"clip_grad": -1.0}, "--clip-grad"),
    ({"micro_batch_size": 0}, "--micro-batch-size"),
    ({"global_batch_size": 0}, "--global-batch-size"),
    ({"critic_warmup_steps": -1}, "--critic-warmup-steps"),
    ({"lr": 0.0}, "--lr"),
    ({"lr_schedule": "step"}, "--lr-schedule"),
    ({"adam_beta2": 1.5}, "--adam-beta2"),
])
def test_a_bad_value_is_a_one_line_usage_error_naming_the_flag(options, flag):
    with pytest.raises(UsageError, match=flag) as caught:
        testing.make_config(plasmid_torchtrain.plugin, **options)
    assert "\n" not in str(caught.value)
