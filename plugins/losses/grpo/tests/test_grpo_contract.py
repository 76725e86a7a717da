"""Every provider of plasmid-grpo against the loss contract, in its main configurations."""

from __future__ import annotations

import plasmid_grpo.plugin

from plasmid_torch.testing.contracts.loss import LossContract


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


class TestGrpoWithTisAndWhiteningContract(LossContract):
    plugin = plasmid_grpo.plugin
    provider = "grpo"
    config_options = {"tis": True, "advantage_whiten": True, "disable_std_normalization": True}


class TestGrpoWithIcepopContract(LossContract):
    plugin = plasmid_grpo.plugin
    provider = "grpo"
    config_options = {"icepop": True, "tis_clip_low": 0.8, "tis_clip": 1.5}


class TestDrGrpoContract(LossContract):
    plugin = plasmid_grpo.plugin
    provider = "dr-grpo"
    config_options = {"max_new_tokens": 8}


class TestDapoContract(LossContract):
    plugin = plasmid_grpo.plugin
    provider = "dapo"
    config_options = {"max_new_tokens": 6, "overlong_buffer_len": 3}


class TestGspoContract(LossContract):
    plugin = plasmid_grpo.plugin
    provider = "gspo"


class TestGspoWithDualClipContract(LossContract):
    plugin = plasmid_grpo.plugin
    provider = "gspo"
    config_options = {"eps_clip": 3e-4, "eps_clip_high": 4e-4, "eps_clip_c": 3.0}


class TestCispoContract(LossContract):
    plugin = plasmid_grpo.plugin
    provider = "cispo"
    config_options = {"eps_clip": 1.0, "eps_clip_high": 0.28, "kl_loss_coef": 0.01}


class TestRlooContract(LossContract):
    plugin = plasmid_grpo.plugin
    provider = "rloo"


class TestGrpoWithTurnCreditContract(LossContract):
    """Turn credit on the contract's batch (a plain LossBatch: one turn a sample), with KL shaping."""

    plugin = plasmid_grpo.plugin
    provider = "grpo"
    config_options = {"turn_credit": "by-turn", "turn_discount": 0.9, "kl_coef": 0.05}


class TestRlooWithPooledTurnCreditContract(LossContract):
    plugin = plasmid_grpo.plugin
    provider = "rloo"
    config_options = {"turn_credit": "pooled"}
