"""zero-std drops the groups that carry no group-relative learning signal, and only those."""

from __future__ import annotations

import plasmid_dynamic.plugin
import pytest
from plasmid_dynamic.options import ZeroStdOptions

from plasmid.errors import UsageError
from plasmid.testing import build, make_config
from plasmid.testing.contracts.filter import make_group
from plasmid.types import Verdict


def zero_std(**options):
    config = make_config(plasmid_dynamic.plugin, **options)
    return build("filter", "zero-std", plasmid_dynamic.plugin, config=config)


@pytest.mark.parametrize("rewards", [[1.0, 0.0, 0.0, 0.0], [0.0, 1.0], [0.2, 0.4, 0.4], [-1.0, 1.0]])
def test_a_group_whose_rewards_differ_is_kept(rewards):
    assert zero_std()(make_group(rewards)) == Verdict(True, "")


@pytest.mark.parametrize("rewards", [[1.0, 1.0, 1.0, 1.0], [0.0, 0.0], [0.3, 0.3, 0.3], [-2.5, -2.5]])
def test_a_group_whose_rewards_are_all_equal_is_dropped_as_zero_std(rewards):
    assert zero_std()(make_group(rewards)) == Verdict(False, "zero_std")


def test_rewards_equal_within_1e_8_count_as_equal():
    assert zero_std()(make_group([1.0, 1.0 + 5e-9, 1.0 - 4e-9])) == Verdict(False, "zero_std")
    assert zero_std()(make_group([1.0, 1.0 + 1e-6])).keep


def test_the_tolerance_is_an_option():
    wide = zero_std(zero_std_tolerance=0.1)
    assert wide(make_group([0.5, 0.55, 0.6])) == Verdict(False, "zero_std")
    assert wide(make_group([0.5, 0.7])).keep
    exact = zero_std(zero_std_tolerance=0.0)
    assert exact(make_group([1.0, 1.0 + 1e-12])).keep


def test_the_tolerance_defaults_to_1e_8():
    assert ZeroStdOptions.of(make_config(plasmid_dynamic.plugin)).zero_std_tolerance == 1e-8
    assert zero_std().tolerance == 1e-8


@pytest.mark.parametrize(("bad", "message"), [
    (-1.0, "--zero-std-tolerance -1.0: must be >= 0"),
    ("wide", "--zero-std-tolerance: expected float, got 'wide'"),
])
def test_a_bad_tolerance_is_a_one_line_usage_error_naming_its_flag(bad, message):
    with pytest.raises(UsageError) as raised:
        make_config(plasmid_dynamic.plugin, zero_std_tolerance=bad)
    assert str(raised.value) == message


def test_a_single_sample_group_has_nothing_to_compare_and_is_dropped():
    assert zero_std()(make_group([1.0])) == Verdict(False, "zero_std")


def test_an_empty_group_is_dropped_as_empty():
    assert zero_std()(make_group([])) == Verdict(False, "empty_group")


def test_the_total_reward_decides_not_its_components():
    group = make_group([1.0, 1.0])
    group.samples[0].reward_components = {"math": 1.0, "format": 0.0}
    group.samples[1].reward_components = {"math": 0.0, "format": 1.0}
    assert zero_std()(group) == Verdict(False, "zero_std")


def test_an_unscored_sample_is_an_error_naming_the_group():
    group = make_group([1.0, 0.0], index=7)
    group.samples[1].reward = None
    with pytest.raises(ValueError, match="group 7 .*filters run after the rewards"):
        zero_std()(group)
