"""GRPO: group-relative advantages and the clipped policy loss (Shao et al. 2024, DeepSeekMath).

Options read (all kernel options of the "algorithm" group): ``--eps-clip``, ``--eps-clip-high``,
``--eps-clip-c``, ``--kl-coef`` (KL to the reference subtracted from each reward),
``--kl-loss-coef`` (KL to the reference added to the loss), ``--kl-estimator``,
``--entropy-coef``, ``--loss-agg``; and ``--max-new-tokens``, the constant length of the
``seq-mean-token-sum-norm`` aggregation.

Variants are small subclasses: each step of the computation is one overridable method
(:meth:`GRPOLoss.sequence_rewards`, :meth:`GRPOLoss.group_advantages`,
:meth:`GRPOLoss.token_policy_loss`, :meth:`GRPOLoss.aggregate`), and the class attributes
:attr:`GRPOLoss.scale_rewards_by_std` and :attr:`GRPOLoss.group_std_eps` set the normalisation.
For example Dr. GRPO is ``scale_rewards_by_std = False`` with ``seq-mean-token-sum-norm``.
"""

from __future__ import annotations

from typing import Any

import torch

from plasmid import algorithms
from plasmid.types import LossBatch


class GRPOLoss:
    """The ``grpo`` loss provider; built by the kernel as ``GRPOLoss(config)``.

    Metrics returned by :meth:`policy_loss` are normalised by the step's totals, like the loss,
    so the trainer sums them over the micro-batches of an optimizer step:

    - ``pg_loss``: the aggregated clipped policy loss;
    - ``clip_frac``: fraction of trained tokens where the clip cut the gradient
      (``dual_clip_frac`` likewise, with ``--eps-clip-c``);
    - ``approx_kl``: k3 estimate of KL(old policy || current policy), token mean;
    - ``kl``: the ``--kl-estimator`` estimate of KL(current || reference), token mean, when the
      reference's log-probs are available; ``kl_loss`` its aggregated loss term;
    - ``entropy``: token mean of the policy's entropy, when given.
    """

    needs_critic = False
    #: The trainer computes old log-probs before the first update (with one update per step the
    #: ratio is then exactly 1, and the loss is the plain policy gradient).
    needs_old_logprobs = True
    #: Divide by the group's standard deviation (``False``: Dr. GRPO's ``r - mean``).
    scale_rewards_by_std = True
    #: Added to the group's standard deviation.
    group_std_eps = algorithms.GROUP_STD_EPS
    #: Estimator of the KL penalty subtracted from rewards (``None``: ``--kl-estimator``).
    reward_kl_estimator: str | None = None

    def __init__(self, config: Any) -> None:
        option = config.option
        self.eps_clip: float = option.eps_clip
        self.eps_clip_high: float | None = option.eps_clip_high
        self.dual_clip_c: float | None = option.eps_clip_c
        self.kl_coef: float = option.kl_coef
        self.kl_loss_coef: float = option.kl_loss_coef
        self.kl_estimator: str = option.kl_estimator
        self.entropy_coef: float = option.entropy_coef
        self.loss_agg: str = option.loss_agg
        self.max_response_length: int | None = getattr(option, "max_new_tokens", None)
        if self.loss_agg not in algorithms.LOSS_AGGREGATIONS:
            raise ValueError(f"--loss-agg {self.loss_agg!r}: choose one of {algorithms.LOSS_AGGREGATIONS}")
        if self.kl_estimator not in algorithms.KL_ESTIMATORS:
            raise ValueError(f"--kl-estimator {self.kl_estimator!r}: choose one of {algorithms.KL_ESTIMATORS}")

    @property
    def needs_ref(self) -> bool:
        """A reference model is needed when KL to it is a reward penalty or a loss term."""
        return self.kl_coef > 0 or self.kl_loss_coef > 0

    # ---------------------------------------------------------------------------------------------
    # advantages
    # ---------------------------------------------------------------------------------------------

    def advantages(self, batch: LossBatch) -> tuple[torch.Tensor, None]:
        """``(advantages [B, T], None)``: group-relative sequence advantages on every trained token."""
        rewards = self.sequence_rewards(batch)
        per_sample = self.group_advantages(rewards, batch.group_index)
        return algorithms.broadcast_to_tokens(per_sample, batch.response_mask), None

    def sequence_rewards(self, batch: LossBatch) -> torch.Tensor:
        """``[B]`` rewards, less ``kl_coef`` times each sample's summed KL (old policy vs reference)."""
        rewards = batch.rewards.float()
        if self.kl_coef <= 0:
            return rewards
        reference = self._require_ref(batch, "--kl-coef")
        estimator = self.reward_kl_estimator or self.kl_estimator
        per_token = algorithms.kl_estimate(batch.old_logprobs, reference, estimator)
        return rewards - self.kl_coef * algorithms.sequence_sum(per_token, batch.response_mask)

    def group_advantages(self, rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
        """``[B]`` advantages from ``[B]`` rewards: relative to the group's mean (and std)."""
        return algorithms.group_normalized_rewards(rewards, group_index, scale_by_std=self.scale_rewards_by_std,
                                                   eps=self.group_std_eps)

    # ---------------------------------------------------------------------------------------------
    # loss
    # ---------------------------------------------------------------------------------------------

    def policy_loss(self, batch: LossBatch, logprobs: torch.Tensor,
                    entropy: torch.Tensor | None) -> tuple[torch.Tensor, dict[str, float]]:
        """Aggregated clipped loss + ``kl_loss_coef`` * KL - ``entropy_coef`` * entropy.

        :param batch: a micro-batch slice with ``advantages`` filled in; totals of the step.
        :param logprobs: ``[B, T]`` current policy log-probs (with gradient).
        :param entropy: ``[B, T]`` current policy entropy, or ``None`` when ``entropy_coef`` is 0.
        :returns: a 0-dim loss tensor and float metrics (see the class docstring).
        """
        if batch.advantages is None:
            raise ValueError("LossBatch.advantages is None: the trainer must fill it from loss.advantages() "
                             "before calling policy_loss()")
        terms = self.token_policy_loss(batch, logprobs)
        pg_loss = self.aggregate(terms.loss, batch)
        loss = pg_loss
        metrics = {
            "pg_loss": float(pg_loss.detach()),
            "clip_frac": float(self.token_mean(terms.clipped, batch)),
            "approx_kl": float(self.token_mean(algorithms.kl_estimate(batch.old_logprobs, logprobs.detach(), "k3"),
                                               batch)),
        }
        if self.dual_clip_c is not None:
            metrics["dual_clip_frac"] = float(self.token_mean(terms.dual_clipped, batch))
        if batch.ref_logprobs is not None:
            kl = algorithms.kl_estimate(logprobs, batch.ref_logprobs, self.kl_estimator)
            metrics["kl"] = float(self.token_mean(kl.detach(), batch))
            if self.kl_loss_coef > 0:
                kl_loss = self.aggregate(kl, batch)
                loss = loss + self.kl_loss_coef * kl_loss
                metrics["kl_loss"] = float(kl_loss.detach())
        elif self.kl_loss_coef > 0:
            self._require_ref(batch, "--kl-loss-coef")
        if entropy is not None:
            metrics["entropy"] = float(self.token_mean(entropy.detach(), batch))
            if self.entropy_coef != 0:
                loss = loss - self.entropy_coef * self.aggregate(entropy, batch)
        elif self.entropy_coef != 0:
            raise ValueError("--entropy-coef is set but the trainer passed entropy=None to policy_loss()")
        return loss, metrics

    def token_policy_loss(self, batch: LossBatch, logprobs: torch.Tensor) -> algorithms.ClippedPolicyLoss:
        """Per-token PPO-clip terms of the current log-probs against the old ones."""
        return algorithms.ppo_clip_loss(logprobs, batch.old_logprobs, batch.advantages, eps_clip=self.eps_clip,
                                        eps_clip_high=self.eps_clip_high, dual_clip_c=self.dual_clip_c)

    def aggregate(self, values: torch.Tensor, batch: LossBatch) -> torch.Tensor:
        """``[B, T] -> []`` with ``--loss-agg``, normalised by the step's totals."""
        return algorithms.aggregate(values, batch.response_mask, self.loss_agg, total_tokens=batch.total_tokens,
                                    total_samples=batch.total_samples,
                                    max_response_length=self.max_response_length)

    @staticmethod
    def token_mean(values: torch.Tensor, batch: LossBatch) -> torch.Tensor:
        """``[B, T] -> []``: sum over trained tokens divided by the step's trained tokens."""
        return algorithms.aggregate(values.detach(), batch.response_mask, "token-mean",
                                    total_tokens=batch.total_tokens, total_samples=batch.total_samples)

    def _require_ref(self, batch: LossBatch, flag: str) -> torch.Tensor:
        if batch.ref_logprobs is None:
            raise ValueError(f"{flag} needs the reference model's log-probs but LossBatch.ref_logprobs is None: "
                             f"the trainer must compute them when loss.needs_ref is true")
        return batch.ref_logprobs
