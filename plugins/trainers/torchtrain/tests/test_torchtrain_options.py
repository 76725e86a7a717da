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
    ({"max_tokens_per_micro_batch": 0}, "--max-tokens-per-micro-batch"),
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


def test_the_torchtrain_options_default_to_full_training_without_memory_savers():
    from plasmid_torchtrain.options import TorchtrainOptions

    from plasmid_torch.device_options import DeviceOptions

    config = testing.make_config(plasmid_torchtrain.plugin)
    own, place = TorchtrainOptions.of(config), DeviceOptions.of(config)
    assert (own.lora_rank, own.gradient_checkpointing, own.optimizer_offload) == (0, False, False)
    assert own.torchtrain_sharding == "fsdp" and own.lora_target_modules == ()
    assert (place.device, place.precision, place.attn_implementation) == ("auto", "fp32", None)


@pytest.mark.parametrize(("options", "flag"), [
    ({"lora_rank": -1}, "--lora-rank"),
    ({"lora_alpha": 0.0}, "--lora-alpha"),
    ({"lora_dropout": 1.5}, "--lora-dropout"),
    ({"torchtrain_sharding": "zero3"}, "--torchtrain-sharding"),
    ({"torchtrain_mmap_threshold": -1}, "--torchtrain-mmap-threshold"),
])
def test_bad_torchtrain_options_are_one_line_errors_naming_the_flag(options, flag):
    with pytest.raises(UsageError, match=f"^{flag}"):
        testing.make_config(plasmid_torchtrain.plugin, **options)


@pytest.mark.parametrize(("options", "threshold"), [
    ({}, 4 << 20),                                                  # full fine-tuning: speed first
    ({"lora_rank": 8}, 1 << 20),                                    # LoRA: the adapters' temporaries fragment
    ({"lora_rank": 8, "torchtrain_mmap_threshold": 0}, 0),          # glibc's adaptive threshold, asked for
    ({"torchtrain_mmap_threshold": 65536}, 65536),
])
def test_the_mmap_threshold_defaults_by_run_kind_and_follows_the_option(options, threshold):
    from plasmid_torchtrain.options import TorchtrainOptions

    assert TorchtrainOptions.of(testing.make_config(plasmid_torchtrain.plugin, **options)).mmap_threshold() == threshold
