"""GRPO: group-relative advantages and the clipped policy loss (Shao et al. 2024, DeepSeekMath).

Each response's advantage is its reward relative to the other responses to the same prompt,
``(r - mean_g) / (std_g + eps)``, on every one of its trained tokens; the loss is PPO's
clipped surrogate with the shared KL, entropy and rollout-correction terms of
:class:`plasmid_torch.policy_gradient.PolicyGradientLoss`. Also read: plasmid-grpo's own
``--disable-std-normalization`` (:class:`plasmid_grpo.options.GRPOOptions`).

Variants are small subclasses (:mod:`plasmid_grpo.variants`): each step of the computation is
one overridable method (:meth:`GRPOLoss.sequence_rewards`, :meth:`GRPOLoss.group_advantages`,
``token_policy_loss``, ``aggregate``), and the class attributes
:attr:`GRPOLoss.scale_rewards_by_std`, :attr:`GRPOLoss.group_std_eps` and
``default_loss_agg`` set the normalisation.
"""

from __future__ import annotations

import torch

from plasmid.config import Config
from plasmid.types import LossBatch
from plasmid_grpo.options import GRPOOptions
from plasmid_torch import algorithms
from plasmid_torch.policy_gradient import PolicyGradientLoss


class GRPOLoss(PolicyGradientLoss):
    """``grpo``: group-normalised advantages ``(r - mean_g) / (std_g + eps)`` and the PPO-clip loss.

    Built by the kernel as ``GRPOLoss(config)``. Metrics: those of
    :class:`~plasmid_torch.policy_gradient.PolicyGradientLoss`.
    """

    option_classes = (*PolicyGradientLoss.option_classes, GRPOOptions)

    #: Divide by the group's standard deviation (``False``: Dr. GRPO's ``r - mean``);
    #: ``--disable-std-normalization`` turns it off for any subclass.
    scale_rewards_by_std = True
    #: Added to the group's standard deviation.
    group_std_eps = algorithms.GROUP_STD_EPS
    #: Advantages compare the samples of one prompt: a group of one has advantage 0, so start-up
    #: refuses ``--n-samples-per-prompt 1`` (``plasmid.startup.check_run``). Every variant too.
    min_samples_per_prompt = 2

    @property
    def advantages_read_old_logprobs(self) -> bool:
        """Whether :meth:`estimate_advantages` reads ``batch.old_logprobs``: only for the KL reward
        penalty (``--kl-coef`` > 0). When it does not, a trainer may take the old log-probs of an
        exactly on-policy step from its update's forward passes
        (:meth:`plasmid_torch.train_step.TrainStep.reuses_update_forward`). A subclass whose
        advantages read them otherwise must return ``True``."""
        return self.kl_coef > 0

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.scale_rewards_by_std = self.scale_rewards_by_std and not GRPOOptions.of(config).disable_std_normalization

    def estimate_advantages(self, batch: LossBatch) -> tuple[torch.Tensor, None]:
        """``(advantages [B, T], None)``: group-relative sequence advantages on every trained token."""
        rewards = self.sequence_rewards(batch)
        per_sample = self.group_advantages(rewards, batch.group_index)
        return algorithms.broadcast_to_tokens(per_sample, batch.response_mask), None

    def sequence_rewards(self, batch: LossBatch) -> torch.Tensor:
        """``[B]`` shaped rewards, less ``kl_coef`` times each sample's summed KL (old policy vs reference)."""
        rewards = self.shaped_rewards(batch)
        if self.kl_coef <= 0:
            return rewards
        return rewards - self.kl_coef * algorithms.sequence_sum(self.reward_kl(batch), batch.response_mask)

    def group_advantages(self, rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
        """``[B]`` advantages from ``[B]`` rewards: relative to the group's mean (and std)."""
        return algorithms.group_normalized_rewards(rewards, group_index, scale_by_std=self.scale_rewards_by_std,
                                                   eps=self.group_std_eps)
