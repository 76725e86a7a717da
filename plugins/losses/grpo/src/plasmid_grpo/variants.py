"""The GRPO family's variants, each a small subclass of :class:`plasmid_grpo.loss.GRPOLoss`.

=========  ===============================================================================
provider   what differs from ``grpo``
=========  ===============================================================================
dr-grpo    advantages ``r - mean_g`` (no std division); loss summed per sequence and divided
           by the constant ``--max-new-tokens`` (``seq-mean-token-sum-norm``): no length or
           difficulty bias (Liu et al. 2025, "Understanding R1-Zero-Like Training").
dapo       "clip higher": ``--eps-clip-high`` defaults to 0.28; token-level aggregation; soft
           overlong punishment, ``--overlong-buffer-len`` defaulting to a fifth of
           ``--max-new-tokens`` (Yu et al. 2025). Its dynamic sampling is the ``dynamic`` filter.
gspo       one importance ratio per sequence, ``exp(mean_t log-ratio)``, clipped as a whole;
           sequence-mean aggregation (Zheng et al. 2025). The paper's clip ranges are tiny
           (``--eps-clip 3e-4 --eps-clip-high 4e-4``).
cispo      ``-sg(clip(r, 1 - eps_clip, 1 + eps_clip_high)) * A * log p``: clipping bounds a
           token's weight but never removes its gradient (MiniMax-M1, 2025). The paper bounds
           only the upper side: ``--eps-clip 1`` removes the lower bound.
rloo       leave-one-out baseline: ``r_i - mean_{j != i} r_j`` (Ahmadian et al. 2024).
=========  ===============================================================================
"""

from __future__ import annotations

import torch

from plasmid.config import Config
from plasmid.types import LossBatch
from plasmid_grpo.loss import GRPOLoss
from plasmid_torch import algorithms


class DrGRPOLoss(GRPOLoss):
    """``dr-grpo``: GRPO done right, without the std and length normalisations."""

    scale_rewards_by_std = False
    default_loss_agg = "seq-mean-token-sum-norm"


class DAPOLoss(GRPOLoss):
    """``dapo``: asymmetric clip, token-level loss, overlong reward shaping."""

    #: ``--eps-clip-high`` when the user gives none (the paper's value).
    default_eps_clip_high = 0.28
    #: ``--overlong-buffer-len`` when unset: this fraction of ``--max-new-tokens`` (the paper:
    #: 4096 of 20480 tokens).
    default_overlong_buffer_fraction = 0.2

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        if self.eps_clip_high is None:
            self.eps_clip_high = self.default_eps_clip_high

    def resolve_overlong_buffer(self, buffer_length: int | None) -> int:
        if buffer_length is not None:
            return int(buffer_length)
        return int(self.max_response_length * self.default_overlong_buffer_fraction)


class GSPOLoss(GRPOLoss):
    """``gspo``: the sequence-level importance ratio, clipped per sequence."""

    default_loss_agg = "seq-mean-token-mean"

    def token_policy_loss(self, batch: LossBatch, logprobs: torch.Tensor) -> algorithms.ClippedPolicyLoss:
        sequence_logprobs = algorithms.sequence_level_logprobs(logprobs, batch.old_logprobs, batch.response_mask)
        return algorithms.ppo_clip_loss(sequence_logprobs, batch.old_logprobs, batch.advantages,
                                        eps_clip=self.eps_clip, eps_clip_high=self.eps_clip_high,
                                        dual_clip_c=self.dual_clip_c)


class CISPOLoss(GRPOLoss):
    """``cispo``: clipped importance weights, without gradient, times the log-prob."""

    def token_policy_loss(self, batch: LossBatch, logprobs: torch.Tensor) -> algorithms.ClippedPolicyLoss:
        return algorithms.cispo_loss(logprobs, batch.old_logprobs, batch.advantages, eps_clip=self.eps_clip,
                                     eps_clip_high=self.eps_clip_high)


class RLOOLoss(GRPOLoss):
    """``rloo``: REINFORCE with the leave-one-out baseline, and the clipped loss."""

    def group_advantages(self, rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
        return algorithms.leave_one_out_advantages(rewards, group_index)
