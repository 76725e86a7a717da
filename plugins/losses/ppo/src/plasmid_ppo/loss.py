"""PPO (Schulman et al. 2017) as in RLHF: a critic, GAE, and clipped policy and value losses.

Per step, on the whole batch (:meth:`PPOLoss.estimate_advantages`):

1. token rewards: ``-kl_coef * KL(old || reference)`` on every trained token (``--kl-coef``,
   ``--kl-estimator``), plus the scalar reward (with DAPO's overlong shaping when
   ``--overlong-buffer-len`` is set) on the last trained token;
2. GAE with ``--gamma`` and ``--lambd`` against the critic's values before the update
   (``LossBatch.values``); returns = advantages + values are the critic's targets;
3. advantages whitened across the batch (always, as verl and OpenRLHF do).

The policy loss is the shared clipped loss (:class:`plasmid_torch.policy_gradient.PolicyGradientLoss`,
with its KL-loss, entropy and TIS/IcePop options); :meth:`PPOLoss.value_loss` is the clipped
value loss with ``--value-clip``. The trainer owns the critic and its warm-up
(``--critic-lr``, ``--critic-warmup-steps``).
"""

from __future__ import annotations

import torch

from plasmid.config import Config
from plasmid.types import LossBatch
from plasmid_ppo.options import PPOOptions
from plasmid_torch import algorithms
from plasmid_torch.loss_options import ReturnOptions
from plasmid_torch.policy_gradient import PolicyGradientLoss


class PPOLoss(PolicyGradientLoss):
    """``ppo``: GAE advantages against a critic, the clipped policy loss and a clipped value loss.

    Built by the kernel as ``PPOLoss(config)``; the trainer's critic is configured with
    ``--critic-lr`` and ``--critic-warmup-steps``.

    Metrics of :meth:`value_loss` (normalised by the step's totals, summed over micro-batches
    by the trainer): ``value_loss``, ``value_clip_frac`` (trained tokens where the clipped
    term was the larger), ``value_pred_mean`` (token mean of the critic's current values).
    """

    option_classes = (*PolicyGradientLoss.option_classes, ReturnOptions, PPOOptions)
    needs_critic = True
    always_whiten = True

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        options = PPOOptions.of(config)
        self.gamma: float = ReturnOptions.of(config).gamma
        self.lambd: float = options.lambd
        #: ``--value-clip``; 0 is the plain squared error
        self.value_clip: float = options.value_clip

    def estimate_advantages(self, batch: LossBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """``(GAE advantages [B, T], returns [B, T])`` from token rewards and the critic's values."""
        values = self._require_values(batch)
        kl = self.reward_kl(batch) if self.kl_coef > 0 else None
        token_rewards = algorithms.token_level_rewards(self.shaped_rewards(batch), batch.response_mask, kl=kl,
                                                       kl_coef=self.kl_coef)
        return algorithms.gae(token_rewards, values, batch.response_mask, gamma=self.gamma, lambd=self.lambd)

    def value_loss(self, batch: LossBatch, values: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """The clipped value loss of the critic's current ``values`` ``[B, T]`` (with gradient)
        against ``batch.returns``, aggregated with ``--loss-agg``; and its metrics.

        :param batch: a micro-batch slice with ``values`` (before the update) and ``returns``.
        """
        old_values = self._require_values(batch)
        if batch.returns is None:
            raise ValueError("LossBatch.returns is None: the trainer must fill it from loss.advantages() before "
                             "calling value_loss()")
        terms = algorithms.clipped_value_loss(values, old_values, batch.returns, value_clip=self.value_clip)
        loss = self.aggregate(terms.loss, batch)
        return loss, {
            "value_loss": float(loss.detach()),
            "value_clip_frac": float(self.token_mean(terms.clipped, batch)),
            "value_pred_mean": float(self.token_mean(values.detach(), batch)),
        }
