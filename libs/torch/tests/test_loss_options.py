"""The policy-gradient family's shared options (plasmid_torch.loss_options): declared by a loss
plugin, read typed with their defaults, bad values and combinations refused at start-up, and the
loss base reading them once."""

from __future__ import annotations

import typing

import pytest

from plasmid import hookimpl, testing
from plasmid.errors import UsageError
from plasmid_torch.loss_options import ROLLOUT_CORRECTION_BANDS, PolicyGradientOptions, ReturnOptions


class LossPlugin:
    """Stands for a loss plugin: declares the family's shared options, as plasmid-ppo does."""

    __name__ = "loss-plugin"

    @hookimpl
    def plasmid_addoption(self, parser):
        parser.add_options(PolicyGradientOptions)
        parser.add_options(ReturnOptions)


def configured(**options):
    return testing.make_config(LossPlugin(), **options)


def test_a_typed_read_gives_the_declared_defaults():
    options = PolicyGradientOptions.of(configured())
    assert options == PolicyGradientOptions.defaults()
    assert (options.eps_clip, options.eps_clip_high, options.eps_clip_c) == (0.2, None, None)
    assert (options.kl_coef, options.kl_loss_coef, options.kl_estimator) == (0.0, 0.0, "k3")
    assert options.loss_agg is None and options.overlong_buffer_len is None
    assert ReturnOptions.of(configured()).gamma == 1.0


def test_no_rollout_correction_by_default():
    options = PolicyGradientOptions.of(configured())
    assert options.rollout_correction is None
    assert options.tis_band == ROLLOUT_CORRECTION_BANDS["tis"] == (0.0, 2.0)


def test_tis_truncates_in_the_band_zero_to_two_by_default():
    options = PolicyGradientOptions.of(configured(tis=True))
    assert (options.rollout_correction, options.tis_band) == ("truncate", (0.0, 2.0))


def test_icepop_masks_outside_the_band_half_to_five_by_default():
    options = PolicyGradientOptions.of(configured(icepop=True))
    assert (options.rollout_correction, options.tis_band) == ("mask", (0.5, 5.0))


def test_a_given_band_is_kept():
    assert PolicyGradientOptions.of(configured(icepop=True, tis_clip_low=0.8, tis_clip=1.25)).tis_band == (0.8, 1.25)
    assert PolicyGradientOptions.of(configured(tis=True, tis_clip=3.0)).tis_band == (0.0, 3.0)


def test_the_band_needs_no_configure_step():
    config = testing.make_config(LossPlugin(), configure=False, icepop=True, tis_clip=4.0)
    assert PolicyGradientOptions.of(config).tis_band == (0.5, 4.0)


def test_loss_aggregation_is_left_to_the_loss_unless_given():
    assert PolicyGradientOptions.of(configured()).loss_agg is None
    assert PolicyGradientOptions.of(configured(loss_agg="token-mean")).loss_agg == "token-mean"


@pytest.mark.parametrize(("options", "message"), [
    ({"eps_clip_c": 0.5}, "--eps-clip-c 0.5: must be > 1"),
    ({"eps_clip": -0.1}, "--eps-clip -0.1: must be >= 0"),
    ({"kl_estimator": "k4"}, "--kl-estimator 'k4': choose one of k1, k2, k3, low-var-kl"),
    ({"loss_agg": "sum"}, "--loss-agg 'sum': choose one of"),
    ({"overlong_buffer_len": -1}, "--overlong-buffer-len -1: must be >= 0"),
    ({"gamma": 1.5}, "--gamma 1.5: must be <= 1"),
    ({"tis": True, "icepop": True}, "--tis .* --icepop .*choose one"),
    ({"tis": True, "tis_clip_low": 3.0, "tis_clip": 2.0}, "0 <= --tis-clip-low < --tis-clip, got \\[3.0, 2.0\\]"),
    ({"icepop": True, "tis_clip": 0.4}, "--tis-clip-low < --tis-clip, got \\[0.5, 0.4\\]"),
    ({"kl_coef": 0.1, "kl_loss_coef": 0.1}, "--kl-coef.*--kl-loss-coef.*not both"),
])
def test_bad_values_are_one_line_usage_errors_naming_the_flags_at_make_config(options, message):
    with pytest.raises(UsageError, match=message) as raised:
        configured(**options)
    assert "\n" not in str(raised.value)


def test_the_flags_are_unknown_until_a_loss_plugin_declares_them():
    with pytest.raises(AttributeError, match="eps_clip"):
        testing.make_config(eps_clip=0.1)


def test_the_choices_are_those_the_math_implements():
    algorithms = pytest.importorskip("plasmid_torch.algorithms")
    hints = typing.get_type_hints(PolicyGradientOptions)
    assert typing.get_args(hints["kl_estimator"]) == algorithms.KL_ESTIMATORS
    loss_agg = [arg for arg in typing.get_args(hints["loss_agg"]) if arg is not type(None)]
    assert typing.get_args(loss_agg[0]) == algorithms.LOSS_AGGREGATIONS


# ------------------------------------------------------------------------------------------------
# PolicyGradientLoss reads them once
# ------------------------------------------------------------------------------------------------


def make_loss(**options):
    policy_gradient = pytest.importorskip("plasmid_torch.policy_gradient")

    class Loss(policy_gradient.PolicyGradientLoss):
        def estimate_advantages(self, batch):
            raise NotImplementedError

    return Loss(configured(**options))


def test_the_loss_base_reads_the_typed_options_and_max_new_tokens():
    from plasmid.kernel_options import RolloutOptions

    loss = make_loss(eps_clip_c=3.0, icepop=True, max_new_tokens=12, kl_loss_coef=0.1)
    assert type(loss).option_classes == (PolicyGradientOptions, RolloutOptions)
    assert loss.options == PolicyGradientOptions.of(configured(eps_clip_c=3.0, icepop=True, kl_loss_coef=0.1))
    assert (loss.dual_clip_c, loss.rollout_correction, loss.tis_band) == (3.0, "mask", (0.5, 5.0))
    assert (loss.max_response_length, loss.loss_agg, loss.needs_ref) == (12, "token-mean", True)
    assert loss.overlong_buffer_length == 0


def test_an_overlong_buffer_longer_than_max_new_tokens_is_a_usage_error_naming_both_flags():
    with pytest.raises(UsageError, match="--overlong-buffer-len 5 is longer than --max-new-tokens 4") as raised:
        make_loss(max_new_tokens=4, overlong_buffer_len=5)
    assert "\n" not in str(raised.value)
    assert make_loss(max_new_tokens=4, overlong_buffer_len=4).overlong_buffer_length == 4
