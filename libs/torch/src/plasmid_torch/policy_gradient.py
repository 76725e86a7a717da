"""What every policy-gradient loss shares: the clipped policy loss with its KL, entropy and
rollout-correction terms, reward shaping, advantage whitening, aggregation and metrics.

:class:`PolicyGradientLoss` implements the :class:`plasmid.protocols.Loss` protocol except for
how advantages are estimated (:meth:`PolicyGradientLoss.estimate_advantages`), which each
algorithm supplies: group-relative (:mod:`plasmid_grpo.loss`), GAE with a critic (plasmid-ppo),
discounted returns (plasmid-reinforce-pp). The math is :mod:`plasmid_torch.algorithms`.

Options read, once, in ``__init__``: :class:`plasmid_torch.loss_options.PolicyGradientOptions`
(``--eps-clip``, ``--eps-clip-high``, ``--eps-clip-c``, ``--kl-coef`` (KL to the reference as a
reward penalty), ``--kl-loss-coef`` (as a loss term), ``--kl-estimator``, ``--entropy-coef``,
``--loss-agg``, ``--advantage-whiten``, ``--overlong-buffer-len``, ``--overlong-penalty-factor``,
``--tis`` / ``--icepop`` with ``--tis-clip-low``, ``--tis-clip`` and ``--tis-mode``), which every
loss plugin declares; and the kernel's ``--max-new-tokens`` (:class:`plasmid.kernel_options.RolloutOptions`),
the constant length of ``seq-mean-token-sum-norm`` and of the overlong shaping.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from plasmid.config import Config
from plasmid.errors import UsageError
from plasmid.kernel_options import RolloutOptions
from plasmid.options import Options
from plasmid.types import LossBatch
from plasmid_torch import algorithms, mismatch
from plasmid_torch.loss_options import PolicyGradientOptions


class PolicyGradientLoss:
    """Base class of the loss providers; built by the kernel as ``Loss(config)``.

    Subclasses implement :meth:`estimate_advantages` and may override the class attributes
    below or one step of the computation (:meth:`shaped_rewards`, :meth:`token_policy_loss`,
    :meth:`aggregate`).

    Metrics returned by :meth:`policy_loss` are normalised by the step's totals, like the loss,
    so the trainer sums them over the micro-batches of an optimizer step:

    - ``pg_loss``: the aggregated policy loss (after the rollout correction);
    - ``clip_frac``: fraction of trained tokens where the clip was active
      (``dual_clip_frac`` likewise, with ``--eps-clip-c``);
    - ``approx_kl``: k3 estimate of KL(old policy || current policy), token mean;
    - ``kl``: the ``--kl-estimator`` estimate of KL(current || reference), token mean, when the
      reference's log-probs are available; ``kl_loss`` its aggregated loss term;
    - ``entropy``: token mean of the policy's entropy, when given;
    - ``ppo_kl``: :func:`plasmid_torch.mismatch.policy_kl` (the same k3 estimate as
      ``approx_kl``; the recipe logs the first update's as ``train/ppo_kl``). The train/rollout
      mismatch (``train/mismatch_kl``, ...) is the recipe's, once per step for every loss
      (:meth:`plasmid_torch.train_step.TrainStep.mismatch_metrics`);
    - with ``--tis`` or ``--icepop`` (at the level of ``--tis-mode``): ``tis_weight_mean``,
      ``tis_outside_frac`` (tokens whose ratio left the band), and the same fraction under the
      name of what the correction did to them: ``tis_truncated_frac`` (``--tis``) or
      ``tis_masked_frac`` (``--icepop``: their loss dropped).
    """

    #: The options classes this loss reads (``plasmid plugins show`` lists their flags); a
    #: subclass that reads more appends its own: ``(*PolicyGradientLoss.option_classes, X)``.
    option_classes: ClassVar[tuple[type[Options], ...]] = (PolicyGradientOptions, RolloutOptions)
    needs_critic = False
    #: The trainer computes old log-probs before the first update (with one update per step the
    #: ratio is then exactly 1, and the loss is the plain policy gradient).
    needs_old_logprobs = True
    #: ``--loss-agg`` when the user gives none.
    default_loss_agg = "token-mean"
    #: Whiten advantages across the batch whatever ``--advantage-whiten`` says (PPO, REINFORCE++).
    always_whiten = False
    #: Estimator of the KL penalty subtracted from rewards (``None``: ``--kl-estimator``).
    reward_kl_estimator: str | None = None

    def __init__(self, config: Config) -> None:
        options = PolicyGradientOptions.of(config)
        #: the typed options of the run (the attributes below are what this loss makes of them)
        self.options: PolicyGradientOptions = options
        self.eps_clip: float = options.eps_clip
        self.eps_clip_high: float | None = options.eps_clip_high
        self.dual_clip_c: float | None = options.eps_clip_c
        self.kl_coef: float = options.kl_coef
        self.kl_loss_coef: float = options.kl_loss_coef
        self.kl_estimator: str = options.kl_estimator
        self.entropy_coef: float = options.entropy_coef
        self.loss_agg: str = options.loss_agg or self.default_loss_agg
        #: ``--max-new-tokens``
        self.max_response_length: int = RolloutOptions.of(config).max_new_tokens
        self.whiten_advantages: bool = self.always_whiten or options.advantage_whiten
        self.overlong_buffer_length: int = self.resolve_overlong_buffer(options.overlong_buffer_len)
        self.overlong_penalty_factor: float = options.overlong_penalty_factor
        #: the mode of :func:`plasmid_torch.algorithms.rollout_correction`: ``truncate`` (``--tis``),
        #: ``mask`` (``--icepop``), or ``None`` (no correction)
        self.rollout_correction: str | None = options.rollout_correction
        #: ``(low, high)`` of the importance-weight band (``--tis-clip-low``, ``--tis-clip``)
        self.tis_band: tuple[float, float] = options.tis_band
        #: ``--tis-mode``: the level of the correction's ratio (token, sequence, geometric)
        self.tis_level: str = options.tis_mode
        if self.overlong_buffer_length > self.max_response_length:
            raise UsageError(f"--overlong-buffer-len {self.overlong_buffer_length} is longer than --max-new-tokens "
                             f"{self.max_response_length} ({type(self).__name__}): choose a buffer of at most the "
                             f"limit")

    def resolve_overlong_buffer(self, buffer_length: int | None) -> int:
        """The overlong buffer in tokens, from ``--overlong-buffer-len`` (``None``: this loss's
        default, 0 = off; DAPO overrides it)."""
        return int(buffer_length or 0)

    @property
    def needs_ref(self) -> bool:
        """A reference model is needed when KL to it is a reward penalty or a loss term."""
        return self.kl_coef > 0 or self.kl_loss_coef > 0

    # ---------------------------------------------------------------------------------------------
    # advantages
    # ---------------------------------------------------------------------------------------------

    def advantages(self, batch: LossBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(advantages [B, T], returns [B, T] or None)`` for the whole step's batch: those of
        :meth:`estimate_advantages`, whitened across the batch when asked; 0 where masked."""
        advantages, returns = self.estimate_advantages(batch)
        if self.whiten_advantages:
            advantages = algorithms.whiten(advantages, batch.response_mask)
        return advantages, returns

    def estimate_advantages(self, batch: LossBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(advantages [B, T], critic targets [B, T] or None)``, 0 where masked. Subclasses implement it."""
        raise NotImplementedError(f"{type(self).__name__} must implement estimate_advantages(batch)")

    def shaped_rewards(self, batch: LossBatch) -> torch.Tensor:
        """``[B]`` rewards plus DAPO's overlong penalty (with ``--overlong-buffer-len``)."""
        rewards: torch.Tensor = batch.rewards.float()
        if not self.overlong_buffer_length:
            return rewards
        lengths = algorithms.response_lengths(batch.response_mask)
        return rewards + algorithms.overlong_penalty(lengths, max_length=self.max_response_length,
                                                     buffer_length=self.overlong_buffer_length,
                                                     penalty_factor=self.overlong_penalty_factor)

    def reward_kl(self, batch: LossBatch) -> torch.Tensor:
        """``[B, T]`` per-token KL(old policy || reference) estimate, for the reward penalty."""
        reference = self._require_ref(batch, "--kl-coef")
        return algorithms.kl_estimate(batch.old_logprobs, reference, self.reward_kl_estimator or self.kl_estimator)

    # ---------------------------------------------------------------------------------------------
    # loss
    # ---------------------------------------------------------------------------------------------

    def policy_loss(self, batch: LossBatch, logprobs: torch.Tensor,
                    entropy: torch.Tensor | None) -> tuple[torch.Tensor, dict[str, float]]:
        """Aggregated policy loss + ``kl_loss_coef`` * KL - ``entropy_coef`` * entropy.

        :param batch: a micro-batch slice with ``advantages`` filled in; totals of the step.
        :param logprobs: ``[B, T]`` current policy log-probs (with gradient).
        :param entropy: ``[B, T]`` current policy entropy, or ``None`` when ``entropy_coef`` is 0.
        :returns: a 0-dim loss tensor and float metrics (see the class docstring).
        """
        if batch.advantages is None:
            raise ValueError("LossBatch.advantages is None: the trainer must fill it from loss.advantages() "
                             "before calling policy_loss()")
        terms = self.token_policy_loss(batch, logprobs)
        metrics: dict[str, float] = {}
        per_token = terms.loss
        if self.rollout_correction is not None:
            rollout = batch.rollout_logprobs
            if rollout is None:
                raise ValueError("--tis/--icepop need the engine's log-probs but LossBatch.rollout_logprobs is None: "
                                 "use an engine that reports them, or drop the flag")
            correction = algorithms.rollout_correction(batch.old_logprobs, rollout, low=self.tis_band[0],
                                                       high=self.tis_band[1], mode=self.rollout_correction,
                                                       level=self.tis_level, mask=batch.response_mask)
            per_token = per_token * correction.weights
            metrics["tis_weight_mean"] = float(self.token_mean(correction.weights, batch))
            metrics["tis_outside_frac"] = float(self.token_mean(correction.outside, batch))
            metrics["tis_masked_frac" if self.rollout_correction == "mask" else "tis_truncated_frac"] = \
                metrics["tis_outside_frac"]
        pg_loss = self.aggregate(per_token, batch)
        loss = pg_loss
        metrics["pg_loss"] = float(pg_loss.detach())
        metrics["clip_frac"] = float(self.token_mean(terms.clipped, batch))
        metrics["approx_kl"] = float(self.token_mean(
            algorithms.kl_estimate(batch.old_logprobs, logprobs.detach(), "k3"), batch))
        metrics["ppo_kl"] = mismatch.policy_kl(batch, logprobs)
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
        ref_logprobs: torch.Tensor = batch.ref_logprobs
        return ref_logprobs

    def _require_values(self, batch: LossBatch) -> torch.Tensor:
        if batch.values is None:
            raise ValueError(f"{type(self).__name__} needs the critic's values but LossBatch.values is None: the "
                             f"trainer must compute them when loss.needs_critic is true")
        values: torch.Tensor = batch.values
        return values
