"""The rollout driver's options: its own class, declared once, and the kernel's, read typed."""

from __future__ import annotations

import plasmid_rollout.plugin
import pytest
from plasmid_rollout.driver import AsyncRolloutDriver
from plasmid_rollout.options import RolloutDriverOptions

from plasmid.errors import UsageError
from plasmid.kernel_options import RolloutOptions
from plasmid.testing import build, make_config


def test_the_typed_read_gives_the_declared_default():
    options = RolloutDriverOptions.of(make_config(plasmid_rollout.plugin))
    assert options == RolloutDriverOptions.defaults()
    assert options.rollout_max_launch_factor == 4 and options.reward_range_bound == 1e3


@pytest.mark.parametrize(("bad", "message"), [
    ({"rollout_max_launch_factor": 0}, "--rollout-max-launch-factor 0: must be >= 1"),
    ({"rollout_max_launch_factor": "many"}, "--rollout-max-launch-factor: expected int, got 'many'"),
    ({"over_sampling": 0.5}, "--over-sampling 0.5: must be >= 1"),
    ({"reward_range_bound": 0.0}, "--reward-range-bound 0.0: must be > 0"),
    ({"reward_range_bound": -5.0}, "--reward-range-bound -5.0: must be > 0"),
    ({"reward_range_bound": "inf"}, "--reward-range-bound: expected a finite number, got 'inf'"),
    ({"reward_range_bound": "big"}, "--reward-range-bound: expected float, got 'big'"),
])
def test_a_bad_value_is_a_one_line_usage_error_naming_its_flag(bad, message):
    with pytest.raises(UsageError) as raised:
        make_config(plasmid_rollout.plugin, **bad)
    assert str(raised.value) == message


def test_the_driver_reads_its_own_and_the_kernels_options_once_when_built():
    config = make_config(plasmid_rollout.plugin, prompts_per_step=5, over_sampling=1.5, rollout_max_launch_factor=2,
                         partial_rollout=True, seed=7)
    driver = build("rollout", "rollout", plasmid_rollout.plugin, config=config)
    assert (driver.prompts_per_step, driver.over_sampling, driver.max_launch_factor) == (5, 1.5, 2)
    assert driver.partial_rollout is True and driver.seed == 7
    assert {RolloutDriverOptions, RolloutOptions} <= set(AsyncRolloutDriver.option_classes)
