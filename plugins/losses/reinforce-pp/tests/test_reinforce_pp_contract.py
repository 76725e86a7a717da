"""plasmid-reinforce-pp's providers against the loss contract."""

from __future__ import annotations

import plasmid_reinforce_pp.plugin

from plasmid_torch.testing.contracts.loss import LossContract


class TestReinforcePlusPlusContract(LossContract):
    plugin = plasmid_reinforce_pp.plugin
    provider = "reinforce++"
    config_options = {"kl_coef": 0.01, "kl_estimator": "k2", "gamma": 0.99}


class TestReinforcePlusPlusBaselineContract(LossContract):
    plugin = plasmid_reinforce_pp.plugin
    provider = "reinforce++-baseline"


class TestReinforcePlusPlusBaselineWithKlLossContract(LossContract):
    plugin = plasmid_reinforce_pp.plugin
    provider = "reinforce++-baseline"
    config_options = {"kl_loss_coef": 0.01, "kl_estimator": "k2", "icepop": True}
