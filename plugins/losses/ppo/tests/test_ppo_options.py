"""plasmid-ppo declares its own options (--value-clip, --lambd) and the family's shared ones
(with --gamma); they are read typed, with their defaults, and bad values are refused when the
configuration is made."""

from __future__ import annotations

import plasmid_ppo.loss
import plasmid_ppo.plugin
import pytest
from plasmid_ppo.options import PPOOptions

from plasmid import testing
from plasmid.errors import UsageError
from plasmid.kernel_options import RolloutOptions
from plasmid_torch.loss_options import PolicyGradientOptions, ReturnOptions


def test_a_typed_read_gives_the_declared_defaults():
    config = testing.make_config(plasmid_ppo.plugin)
    assert (PPOOptions.of(config).value_clip, PPOOptions.of(config).lambd) == (0.2, 1.0)
    assert ReturnOptions.of(config).gamma == 1.0
    assert PolicyGradientOptions.of(config) == PolicyGradientOptions.defaults()


def test_the_loss_reads_the_shared_the_kernels_and_its_own_options():
    assert plasmid_ppo.loss.PPOLoss.option_classes == (PolicyGradientOptions, RolloutOptions, ReturnOptions,
                                                       PPOOptions)
    config = testing.make_config(plasmid_ppo.plugin, gamma=0.9, lambd=0.5, value_clip=0.0)
    loss = testing.build("loss", "ppo", plasmid_ppo.plugin, config=config)
    assert (loss.gamma, loss.lambd, loss.value_clip) == (0.9, 0.5, 0.0)


@pytest.mark.parametrize(("options", "message"), [
    ({"value_clip": -0.1}, "--value-clip -0.1: must be >= 0"),
    ({"lambd": 1.5}, "--lambd 1.5: must be <= 1"),
    ({"gamma": -0.1}, "--gamma -0.1: must be >= 0"),
    ({"eps_clip_c": 0.5}, "--eps-clip-c 0.5: must be > 1"),
    ({"kl_coef": 0.1, "kl_loss_coef": 0.1}, "--kl-coef.*--kl-loss-coef.*not both"),
])
def test_bad_values_are_one_line_usage_errors_naming_the_flag(options, message):
    with pytest.raises(UsageError, match=message) as raised:
        testing.make_config(plasmid_ppo.plugin, **options)
    assert "\n" not in str(raised.value)
