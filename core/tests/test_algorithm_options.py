"""The kernel's critic options (transitional, plasmid.legacy_training_options): ``--critic-lr``
defaults to ``--lr`` at configure time, bad values are refused. The loss family's options are
plasmid-torch's (libs/torch/tests/test_loss_options.py)."""

from __future__ import annotations

import pytest

from plasmid import testing
from plasmid.errors import UsageError


def configured(**options):
    return testing.make_config(**options).option


def test_a_negative_critic_warmup_is_a_usage_error():
    with pytest.raises(UsageError, match="--critic-warmup-steps"):
        configured(critic_warmup_steps=-1)


def test_critic_lr_defaults_to_the_policy_lr():
    assert configured(lr=3e-4).critic_lr == 3e-4
    assert configured(lr=3e-4, critic_lr=1e-3).critic_lr == 1e-3
