"""plasmid-grpo declares its own option and the family's shared ones; they are read typed, with
their defaults, and bad values are refused when the configuration is made."""

from __future__ import annotations

import plasmid_grpo.loss
import plasmid_grpo.plugin
import pytest
from plasmid_grpo.options import GRPOOptions

from plasmid import testing
from plasmid.errors import UsageError
from plasmid.kernel_options import RolloutOptions
from plasmid_torch.loss_options import PolicyGradientOptions


def test_a_typed_read_gives_the_declared_defaults():
    config = testing.make_config(plasmid_grpo.plugin)
    assert GRPOOptions.of(config).disable_std_normalization is False
    assert PolicyGradientOptions.of(config) == PolicyGradientOptions.defaults()
    assert PolicyGradientOptions.of(config).eps_clip == 0.2


def test_every_loss_reads_the_shared_the_kernels_and_its_own_options():
    assert plasmid_grpo.loss.GRPOLoss.option_classes == (PolicyGradientOptions, RolloutOptions, GRPOOptions)


@pytest.mark.parametrize(("options", "message"), [
    ({"eps_clip_c": 0.5}, "--eps-clip-c 0.5: must be > 1"),
    ({"disable_std_normalization": "yes"}, "--disable-std-normalization: expected true or false"),
    ({"tis": True, "icepop": True}, "--tis .* --icepop .*choose one"),
])
def test_bad_values_are_one_line_usage_errors_naming_the_flag(options, message):
    with pytest.raises(UsageError, match=message) as raised:
        testing.make_config(plasmid_grpo.plugin, **options)
    assert "\n" not in str(raised.value)
