"""The options the policy-gradient losses share, declared by every loss plugin that reads them.

- :class:`PolicyGradientOptions`: the clipped policy loss, its KL, entropy and rollout-correction
  terms, reward shaping, whitening and aggregation; read by
  :class:`plasmid_torch.policy_gradient.PolicyGradientLoss`, so by every loss of plasmid-grpo,
  plasmid-ppo and plasmid-reinforce-pp;
- :class:`ReturnOptions`: the discount of per-token returns (plasmid-ppo, plasmid-reinforce-pp).

A loss plugin declares the classes it reads in its hook (declaring one class from several
plugins is allowed)::

    @hookimpl
    def plasmid_addoption(parser):
        parser.add_options(PolicyGradientOptions)

Options of a single loss plugin live in that plugin (``plasmid_ppo.options.PPOOptions``,
``plasmid_grpo.options.GRPOOptions``). This module imports no torch: plugins import it when
they declare options, before any loss is chosen.
"""

from __future__ import annotations

from typing import Literal

from plasmid.errors import UsageError
from plasmid.options import Options, option

#: ``(--tis-clip-low, --tis-clip)`` when left unset: slime's TIS defaults, the IcePop paper's band.
ROLLOUT_CORRECTION_BANDS: dict[str, tuple[float, float]] = {"tis": (0.0, 2.0), "icepop": (0.5, 5.0)}


class PolicyGradientOptions(Options, group="algorithm",
                            description="shared by the policy-gradient losses (plasmid-grpo, plasmid-ppo, "
                                        "plasmid-reinforce-pp)"):
    """The shared options of :class:`plasmid_torch.policy_gradient.PolicyGradientLoss`.

    Derived: :attr:`tis_band` (the importance-weight band) and :attr:`rollout_correction` (the
    mode of :func:`plasmid_torch.algorithms.rollout_correction`).
    """

    eps_clip: float = option(0.2, "PPO clip range (low side)", min=0)
    eps_clip_high: float | None = option(None, "PPO clip high side", min=0,
                                         default_text="--eps-clip; dapo: 0.28")
    eps_clip_c: float | None = option(None, "dual-clip bound c > 1", gt=1, default_text="off")
    kl_coef: float = option(0.0, "KL to the reference as a reward penalty", min=0)
    kl_loss_coef: float = option(0.0, "KL to the reference as a loss term", min=0)
    # The choices are plasmid_torch.algorithms.KL_ESTIMATORS (a test keeps the two equal).
    kl_estimator: Literal["k1", "k2", "k3", "low-var-kl"] = option(
        "k3", "per-token estimate of KL to the reference (low-var-kl: k3 clamped to [-10, 10])")
    entropy_coef: float = option(0.0, "entropy bonus: this times the entropy is subtracted from the loss")
    # The choices are plasmid_torch.algorithms.LOSS_AGGREGATIONS (a test keeps the two equal).
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] | None = option(
        None, "how per-token losses are averaged", default_text="the loss's own, token-mean for most; "
        "seq-mean-token-sum-norm for dr-grpo, seq-mean-token-mean for gspo")
    advantage_whiten: bool = option(False, "whiten advantages across the batch: (A - mean) / std over all "
                                    "trained tokens (ppo and reinforce++ always do)")
    overlong_buffer_len: int | None = option(
        None, "DAPO's overlong shaping: penalise responses longer than --max-new-tokens minus this many tokens, "
        "linearly", min=0, default_text="off; dapo: a fifth of --max-new-tokens")
    overlong_penalty_factor: float = option(1.0, "the overlong penalty at --max-new-tokens tokens")
    tis: bool = option(False, "truncated importance sampling: weight each token's policy loss by "
                       "clamp(exp(old - rollout log-prob), --tis-clip-low, --tis-clip)")
    icepop: bool = option(False, "IcePop: weight by exp(old - rollout log-prob) inside [--tis-clip-low, "
                          "--tis-clip], drop tokens outside")
    tis_clip: float | None = option(None, "upper edge of the band", default_text="2 for --tis, 5 for --icepop")
    tis_clip_low: float | None = option(None, "lower edge of the band", default_text="0 for --tis, 0.5 for --icepop")
    # The choices are plasmid_torch.algorithms.ROLLOUT_CORRECTION_LEVELS (a test keeps the two equal).
    tis_mode: Literal["token", "sequence", "geometric"] = option(
        "token", "whose importance ratio --tis / --icepop weigh a token by: its own (token), its sequence's "
        "(sequence: the product of the sample's token ratios; with --icepop the whole sample is masked), or "
        "the geometric mean of its sequence's (geometric)")

    def check(self) -> None:
        if self.kl_coef and self.kl_loss_coef:
            raise UsageError("use KL either as a reward penalty (--kl-coef) or as a loss term (--kl-loss-coef), "
                             "not both")
        if self.tis and self.icepop:
            raise UsageError("--tis truncates the importance weights and --icepop masks them: choose one")
        if self.tis_mode != "token" and not (self.tis or self.icepop):
            raise UsageError(f"--tis-mode {self.tis_mode} sets the level of a rollout correction: add --tis "
                             f"(truncate the weights) or --icepop (mask them)")
        low, high = self.tis_band
        if not 0 <= low < high:
            raise UsageError(f"the importance-weight band needs 0 <= --tis-clip-low < --tis-clip, got [{low}, {high}]")

    @property
    def tis_band(self) -> tuple[float, float]:
        """``(low, high)`` of the importance-weight band: the flags, else the mode's
        :data:`ROLLOUT_CORRECTION_BANDS` entry."""
        low, high = ROLLOUT_CORRECTION_BANDS["icepop" if self.icepop else "tis"]
        return (low if self.tis_clip_low is None else self.tis_clip_low,
                high if self.tis_clip is None else self.tis_clip)

    @property
    def rollout_correction(self) -> Literal["truncate", "mask"] | None:
        """The mode of :func:`plasmid_torch.algorithms.rollout_correction`: ``truncate``
        (``--tis``), ``mask`` (``--icepop``), or ``None`` (no correction)."""
        return "mask" if self.icepop else "truncate" if self.tis else None


class ReturnOptions(Options, group="algorithm"):
    """The discount of per-token returns, read by the losses that build them (plasmid-ppo's GAE,
    plasmid-reinforce-pp's discounted returns)."""

    gamma: float = option(1.0, "discount of per-token returns (ppo, reinforce++)", min=0, max=1)


__all__ = ["ROLLOUT_CORRECTION_BANDS", "PolicyGradientOptions", "ReturnOptions"]
