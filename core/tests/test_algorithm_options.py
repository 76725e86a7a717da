"""The kernel's algorithm and critic options: defaults filled at configure time, bad combinations refused."""

from __future__ import annotations

import pytest

from plasmid import testing
from plasmid.errors import UsageError


def configured(**options):
    return testing.make_config(**options).option


def test_no_rollout_correction_by_default():
    option = configured()
    assert not option.tis and not option.icepop
    assert (option.tis_clip_low, option.tis_clip) == (0.0, 2.0)


def test_tis_truncates_in_the_band_zero_to_two_by_default():
    option = configured(tis=True)
    assert (option.tis_clip_low, option.tis_clip) == (0.0, 2.0)


def test_icepop_masks_outside_the_band_half_to_five_by_default():
    option = configured(icepop=True)
    assert (option.tis_clip_low, option.tis_clip) == (0.5, 5.0)


def test_a_given_band_is_kept():
    option = configured(icepop=True, tis_clip_low=0.8, tis_clip=1.25)
    assert (option.tis_clip_low, option.tis_clip) == (0.8, 1.25)


@pytest.mark.parametrize(("options", "message"), [
    ({"tis": True, "icepop": True}, "choose one"),
    ({"tis": True, "tis_clip_low": 3.0, "tis_clip": 2.0}, "--tis-clip-low < --tis-clip"),
    ({"kl_coef": 0.1, "kl_loss_coef": 0.1}, "not both"),
    ({"gamma": 1.5}, "--gamma"),
    ({"lambd": -0.1}, "--lambd"),
    ({"critic_warmup_steps": -1}, "--critic-warmup-steps"),
])
def test_bad_combinations_are_usage_errors(options, message):
    with pytest.raises(UsageError, match=message):
        configured(**options)


def test_critic_lr_defaults_to_the_policy_lr():
    assert configured(lr=3e-4).critic_lr == 3e-4
    assert configured(lr=3e-4, critic_lr=1e-3).critic_lr == 1e-3


def test_loss_aggregation_is_left_to_the_loss_unless_given():
    assert configured().loss_agg is None
    assert configured(loss_agg="token-mean").loss_agg == "token-mean"
