"""plasmid-grpo against the loss contract, in its main configurations."""

from __future__ import annotations

import plasmid_grpo.plugin

from plasmid.testing.contracts.loss import LossContract


class TestGrpoContract(LossContract):
    plugin = plasmid_grpo.plugin
    provider = "grpo"


class TestGrpoWithKlLossAndEntropyContract(LossContract):
    plugin = plasmid_grpo.plugin
    provider = "grpo"
    config_options = {"kl_loss_coef": 0.1, "kl_estimator": "low-var-kl", "entropy_coef": 0.01,
                      "loss_agg": "seq-mean-token-mean", "eps_clip_c": 3.0}


class TestGrpoWithKlPenaltyContract(LossContract):
    plugin = plasmid_grpo.plugin
    provider = "grpo"
    config_options = {"kl_coef": 0.05, "kl_estimator": "k1", "loss_agg": "seq-mean-token-sum-norm",
                      "eps_clip_high": 0.28}
