"""REINFORCE++: PPO's tricks without a critic (Hu et al. 2025, OpenRLHF).

Per step, on the whole batch:

1. (``reinforce++-baseline`` only) each reward less its group's mean;
2. token rewards: ``-kl_coef * KL(old || reference)`` on every trained token (``--kl-coef``,
   ``--kl-estimator``), plus the scalar reward on the last trained token;
3. discounted returns ``G_t = r_t + gamma * G_{t+1}`` (``--gamma``) over trained tokens;
4. the returns whitened across the whole batch (all trained tokens of all samples): these are
   the advantages.

The policy loss is the shared clipped loss with its KL-loss, entropy and TIS/IcePop options.
"""

from __future__ import annotations

import torch

from plasmid.config import Config
from plasmid.types import LossBatch
from plasmid_torch import algorithms
from plasmid_torch.loss_options import ReturnOptions
from plasmid_torch.policy_gradient import PolicyGradientLoss


class ReinforcePlusPlusLoss(PolicyGradientLoss):
    """``reinforce++``: discounted token returns with a KL penalty, whitened across the batch.

    Built by the kernel as ``ReinforcePlusPlusLoss(config)``.
    """

    option_classes = (*PolicyGradientLoss.option_classes, ReturnOptions)
    always_whiten = True
    #: Subtract each group's mean reward before building token rewards (``reinforce++-baseline``).
    group_baseline = False

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.gamma: float = ReturnOptions.of(config).gamma

    def estimate_advantages(self, batch: LossBatch) -> tuple[torch.Tensor, None]:
        """``(discounted returns [B, T], None)``; :meth:`advantages` whitens them."""
        rewards = self.shaped_rewards(batch)
        if self.group_baseline:
            rewards = algorithms.group_normalized_rewards(rewards, batch.group_index, scale_by_std=False)
        kl = self.reward_kl(batch) if self.kl_coef > 0 else None
        token_rewards = algorithms.token_level_rewards(rewards, batch.response_mask, kl=kl, kl_coef=self.kl_coef)
        return algorithms.discounted_returns(token_rewards, batch.response_mask, self.gamma), None


class ReinforcePlusPlusBaselineLoss(ReinforcePlusPlusLoss):
    """``reinforce++-baseline``: the group-mean reward as baseline, then global whitening."""

    group_baseline = True
    #: The group-mean baseline of a group of one is its own reward: start-up refuses
    #: ``--n-samples-per-prompt 1`` (``plasmid.startup.check_run``); ``reinforce++`` learns from 1.
    min_samples_per_prompt = 2
