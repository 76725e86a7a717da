"""plasmid-ppo against the loss contract (its critic checks included)."""

from __future__ import annotations

import plasmid_ppo.plugin

from plasmid_torch.testing.contracts.loss import LossContract


class TestPpoContract(LossContract):
    plugin = plasmid_ppo.plugin
    provider = "ppo"


class TestPpoWithKlPenaltyAndDiscountContract(LossContract):
    plugin = plasmid_ppo.plugin
    provider = "ppo"
    config_options = {"kl_coef": 0.05, "kl_estimator": "k1", "gamma": 0.95, "lambd": 0.9, "value_clip": 0.0,
                      "loss_agg": "seq-mean-token-mean", "tis": True}
