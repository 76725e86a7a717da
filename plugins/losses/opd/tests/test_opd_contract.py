"""plasmid-opd's loss against the loss contract (the contract fills the teacher's log-probs as
``ref_logprobs``, as the recipe does from the samples)."""

from __future__ import annotations

from pathlib import Path

import plasmid_opd.plugin

from plasmid_torch.testing.contracts.loss import LossContract

#: --loss opd needs an existing --teacher-model directory; the loss never reads it (the samples bring the scores)
TEACHER = str(Path(__file__).parent)


class TestOPDContract(LossContract):
    plugin = plasmid_opd.plugin
    provider = "opd"
    config_options = {"teacher_model": TEACHER}


class TestOPDWithRewardAndCorrectionContract(LossContract):
    plugin = plasmid_opd.plugin
    provider = "opd"
    config_options = {"opd_reward_weight": 0.5, "icepop": True, "tis_mode": "sequence", "kl_loss_coef": 0.1,
                      "teacher_model": TEACHER}
