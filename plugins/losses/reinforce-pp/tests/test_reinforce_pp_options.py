"""plasmid-reinforce-pp declares the family's shared options (with --gamma, and no --lambd: only
PPO's GAE reads it); they are read typed, with their defaults, and bad values are refused when
the configuration is made."""

from __future__ import annotations

import plasmid_reinforce_pp.loss
import plasmid_reinforce_pp.plugin
import pytest

from plasmid import testing
from plasmid.errors import UsageError
from plasmid.kernel_options import RolloutOptions
from plasmid_torch.loss_options import PolicyGradientOptions, ReturnOptions


def test_a_typed_read_gives_the_declared_defaults():
    config = testing.make_config(plasmid_reinforce_pp.plugin)
    assert ReturnOptions.of(config).gamma == 1.0
    assert PolicyGradientOptions.of(config) == PolicyGradientOptions.defaults()
    assert not hasattr(config.option, "lambd")


def test_both_losses_read_the_shared_and_the_kernels_options():
    module = plasmid_reinforce_pp.loss
    for loss in (module.ReinforcePlusPlusLoss, module.ReinforcePlusPlusBaselineLoss):
        assert loss.option_classes == (PolicyGradientOptions, RolloutOptions, ReturnOptions)


@pytest.mark.parametrize(("options", "message"), [
    ({"gamma": 1.5}, "--gamma 1.5: must be <= 1"),
    ({"eps_clip_c": 0.5}, "--eps-clip-c 0.5: must be > 1"),
    ({"tis": True, "icepop": True}, "--tis .* --icepop .*choose one"),
])
def test_bad_values_are_one_line_usage_errors_naming_the_flag(options, message):
    with pytest.raises(UsageError, match=message) as raised:
        testing.make_config(plasmid_reinforce_pp.plugin, **options)
    assert "\n" not in str(raised.value)
