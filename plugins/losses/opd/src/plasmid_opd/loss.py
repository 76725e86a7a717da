"""``--loss opd``: the clipped policy loss with the teacher's per-token advantages (imports torch)."""

from __future__ import annotations

import torch

from plasmid.config import Config
from plasmid.errors import UsageError
from plasmid.types import LossBatch
from plasmid_opd.generate import TEACHER_LOGPROBS_KEY
from plasmid_opd.options import OPDOptions
from plasmid_torch import algorithms
from plasmid_torch.policy_gradient import PolicyGradientLoss


class OPDLoss(PolicyGradientLoss):
    """``opd``: on-policy distillation, the teacher's per-token advantages on the clipped loss.

    Each trained token's advantage is ``log p_teacher - log p_student`` (the per-token estimate
    of the negative reverse KL, on the student's own samples), plus ``--opd-reward-weight`` times
    the task reward's group-relative advantage ``(r - mean_g) / (std_g + eps)``.

    Built by the kernel as ``OPDLoss(config)``. The teacher's log-probs reach the loss as
    ``LossBatch.ref_logprobs``: the recipe (:class:`plasmid_torch.train_step.TrainStep`) reads
    each sample's ``metadata[reference_logprobs_key]`` (``--generate opd`` puts them there) since
    the trainer keeps no reference model of its own (``needs_ref`` is false). The teacher is the
    reference, so the shared ``kl`` metric is KL(student || teacher) and ``--kl-loss-coef`` adds
    it as a loss term. The student log-probs are the trainer's old ones. Each distillation
    advantage is taken per token (no discounting: the reverse KL of later tokens is not credited
    to earlier ones). ``--kl-coef`` is refused: the advantage already is the KL penalty.

    The raw advantage has no baseline (on the quickstart it averages about -2.6 nats): give
    ``--advantage-whiten`` (the batch mean is the baseline) and several samples per prompt. Measured
    in ``tests/test_opd_distill.py``: with both (8 samples) a fresh student climbs from chance to
    the teacher's answers; without whitening, or with 2 samples per prompt, it stays at chance.

    Metrics: those of :class:`~plasmid_torch.policy_gradient.PolicyGradientLoss`, and
    ``opd_reverse_kl``, the token mean of ``log p_student - log p_teacher`` under the old policy
    (the k1 estimate of the reverse KL the advantages lower).
    """

    option_classes = (*PolicyGradientLoss.option_classes, OPDOptions)
    #: where the recipe finds the teacher's log-probs in ``Sample.metadata``
    reference_logprobs_key = TEACHER_LOGPROBS_KEY

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        if self.kl_coef > 0:
            raise UsageError(f"--loss opd: --kl-coef {self.kl_coef} would penalise KL to the teacher twice (the "
                             f"distillation advantage is that penalty); use --kl-loss-coef for a KL loss term")
        #: ``--opd-reward-weight``
        self.reward_weight: float = OPDOptions.of(config).opd_reward_weight

    @property
    def needs_ref(self) -> bool:
        """No reference model in the trainer: the teacher's scores come with the samples."""
        return False

    def estimate_advantages(self, batch: LossBatch) -> tuple[torch.Tensor, None]:
        """``(advantages [B, T], None)``: ``teacher - old`` per trained token, plus the weighted reward advantage."""
        teacher = self._require_ref(batch, "--loss opd")
        mask = batch.response_mask
        advantages = torch.where(mask > 0, teacher.float() - batch.old_logprobs.float(), torch.zeros_like(mask))
        if self.reward_weight > 0:
            rewards = algorithms.group_normalized_rewards(self.shaped_rewards(batch), batch.group_index)
            advantages = advantages + self.reward_weight * algorithms.broadcast_to_tokens(rewards, mask)
        return advantages, None

    def policy_loss(self, batch: LossBatch, logprobs: torch.Tensor,
                    entropy: torch.Tensor | None) -> tuple[torch.Tensor, dict[str, float]]:
        loss, metrics = super().policy_loss(batch, logprobs, entropy)
        teacher = self._require_ref(batch, "--loss opd")
        metrics["opd_reverse_kl"] = float(self.token_mean(batch.old_logprobs - teacher, batch))
        return loss, metrics
