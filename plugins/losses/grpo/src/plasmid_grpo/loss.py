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

Turn credit (``--turn-credit by-turn | pooled``, ``--turn-discount``): for samples that carry
per-turn rewards (:mod:`plasmid_torch.turns`), each turn's return ``G_k = r_k + gamma * G_{k+1}``
is compared, by the same :meth:`GRPOLoss.group_advantages` (so each variant's baseline), with the
returns of the same turn index in the group's other samples (``by-turn``) or with all the group's
turns (``pooled``), and every token of the turn gets that advantage. The turn rewards plus the
remainder ``shaped reward - sum(turn rewards)`` (other rewards, weights, overlong and KL shaping),
credited to the last turn, add up to the sequence reward; so a sample without per-turn rewards is
one turn, and with ``by-turn`` and ``--turn-discount 1`` turn 0 gets exactly the scalar advantage.
"""

from __future__ import annotations

import torch

from plasmid.config import Config
from plasmid.types import LossBatch
from plasmid_grpo.options import GRPOOptions
from plasmid_torch import algorithms
from plasmid_torch.policy_gradient import PolicyGradientLoss
from plasmid_torch.turns import TurnLossBatch


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
        options = GRPOOptions.of(config)
        self.scale_rewards_by_std = self.scale_rewards_by_std and not options.disable_std_normalization
        #: ``--turn-credit``: ``none``, ``by-turn`` or ``pooled``; ``--turn-discount``.
        self.turn_credit: str = options.turn_credit
        self.turn_discount: float = options.turn_discount

    @property
    def reads_turn_rewards(self) -> bool:
        """Whether the trainer must give :meth:`estimate_advantages` the samples' turns (a
        :class:`plasmid_torch.turns.TurnLossBatch`, :func:`plasmid_torch.turns.with_turns`)."""
        return self.turn_credit != "none"

    def estimate_advantages(self, batch: LossBatch) -> tuple[torch.Tensor, None]:
        """``(advantages [B, T], None)``: group-relative sequence advantages on every trained token,
        or with turn credit each turn's advantage on its tokens (see the module docstring)."""
        rewards = self.sequence_rewards(batch)
        if self.turn_credit != "none":
            return self.turn_advantages(batch, rewards), None
        per_sample = self.group_advantages(rewards, batch.group_index)
        return algorithms.broadcast_to_tokens(per_sample, batch.response_mask), None

    def turn_advantages(self, batch: LossBatch, rewards: torch.Tensor) -> torch.Tensor:
        """``[B, T]`` turn-level advantages from the ``[B]`` sequence rewards and the batch's turns
        (a plain :class:`LossBatch` is one turn a sample)."""
        if isinstance(batch, TurnLossBatch) and batch.turn_rewards is not None:
            turn_rewards, turn_index = batch.turn_rewards.float().clone(), batch.turn_index
        else:
            turn_rewards = torch.zeros_like(rewards).unsqueeze(-1)
            turn_index = torch.zeros(batch.response_mask.shape, dtype=torch.long, device=rewards.device)
        present = ~torch.isnan(turn_rewards)
        last = present.sum(-1).clamp(min=1) - 1
        remainder = rewards.float() - torch.nan_to_num(turn_rewards).sum(-1)
        rows = torch.arange(turn_rewards.shape[0], device=turn_rewards.device)
        turn_rewards[rows, last] = torch.nan_to_num(turn_rewards[rows, last]) + remainder
        returns = algorithms.turn_returns(turn_rewards, self.turn_discount)
        per_turn = algorithms.turn_group_advantages(returns, batch.group_index, self.group_advantages,
                                                    by_turn=self.turn_credit == "by-turn")
        return algorithms.turns_to_tokens(per_turn, turn_index, batch.response_mask)

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
