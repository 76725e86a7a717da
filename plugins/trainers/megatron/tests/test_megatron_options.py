"""plasmid-megatron's own options (MegatronOptions) and the trainers' shared ones (TrainerOptions):
declared by the plugin, read typed, bad values refused at configuration with the flag named."""

from __future__ import annotations

import plasmid_megatron.plugin
import pytest
from plasmid_megatron.critic import critic_lr_settings
from plasmid_megatron.options import MegatronOptions

from plasmid import testing
from plasmid.config import OptionParser
from plasmid.errors import UsageError
from plasmid_torch.trainer_options import TrainerOptions


def test_the_plugin_declares_its_options_and_the_trainer_options():
    parser = OptionParser()
    testing.make_manager(plasmid_megatron.plugin).addoption(parser)
    assert MegatronOptions in parser.option_classes and TrainerOptions in parser.option_classes


def test_the_trainer_lists_the_options_it_reads():
    from plasmid_megatron.trainer import MegatronTrainer

    assert {TrainerOptions, MegatronOptions} <= set(MegatronTrainer.option_classes)


def test_typed_reads_give_the_declared_defaults():
    options = MegatronOptions.of(testing.make_config(plasmid_megatron.plugin))
    assert (options.tensor_model_parallel_size, options.pipeline_model_parallel_size,
            options.context_parallel_size, options.expert_model_parallel_size) == (1, 1, 1, 1)
    assert options.make_vocab_size_divisible_by == 128
    assert TrainerOptions.of(testing.make_config(plasmid_megatron.plugin)).max_tokens_per_micro_batch is None


@pytest.mark.parametrize(("options", "flag"), [
    ({"pipeline_model_parallel_size": 0}, "--pipeline-model-parallel-size"),
    ({"tensor_model_parallel_size": 0}, "--tensor-model-parallel-size"),
    ({"context_parallel_size": -1}, "--context-parallel-size"),
    ({"expert_model_parallel_size": 0}, "--expert-model-parallel-size"),
    ({"max_tokens_per_micro_batch": 0}, "--max-tokens-per-micro-batch"),
    ({"make_vocab_size_divisible_by": 0}, "--make-vocab-size-divisible-by"),
    ({"micro_batch_size": 0}, "--micro-batch-size"),
])
def test_a_bad_value_is_a_one_line_usage_error_naming_the_flag(options, flag):
    with pytest.raises(UsageError, match=f"{flag} .*must be >= 1") as caught:
        testing.make_config(plasmid_megatron.plugin, **options)
    assert "\n" not in str(caught.value)


def test_the_critic_schedule_is_the_policys_scaled_to_the_critic_lr():
    assert critic_lr_settings(TrainerOptions.from_values({"lr": 1e-3, "min_lr": 1e-4})) == (1e-3, 1e-4)
    lr, min_lr = critic_lr_settings(TrainerOptions.from_values({"lr": 1e-3, "min_lr": 1e-4, "critic_lr": 2e-3}))
    assert lr == 2e-3 and min_lr == pytest.approx(2e-4)
