"""Train/rollout mismatch diagnostics, computed once per step for every loss (imports torch).

The engine samples with its own kernels (another attention implementation, bf16, batching): its
log-probs of the sampled tokens (``rollout_logprobs``) differ a little from the trainer's of the
same weights (``old_logprobs``). :func:`step_mismatch_metrics` measures how much, on the whole
step's batch, and :class:`plasmid_torch.train_step.TrainStep` logs it on every step where both
exist (whatever the loss; a loss need not compute anything). :func:`policy_kl` is the in-loss half:
KL(old policy || current policy) at the forward pass of the update, which must be 0 on-policy
(slime's CI checks it); losses report it as ``ppo_kl`` and the recipe logs the first update's.

Names (``train/`` prefix; token statistics are over trained tokens, ``response_mask > 0``):

- ``mismatch_kl``: k3 estimate of KL(engine || trainer), token mean;
- ``logprob_abs_diff_mean``: token mean of ``|trainer - engine|`` log-prob (``mismatch_abs_diff``
  is the same number under its earlier name);
- ``token_prob_ratio_max``: the largest ``exp(trainer - engine)`` of a token (log-ratio clamped to
  ``[-20, 20]``); ``mismatch_ratio_mean`` its token mean;
- ``ppo_kl``: see :func:`policy_kl`.
"""

from __future__ import annotations

import torch

from plasmid.types import LossBatch
from plasmid_torch import algorithms


def step_mismatch_metrics(trainer_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor,
                          mask: torch.Tensor) -> dict[str, float]:
    """The mismatch metrics of a step (names without ``train/``, see the module docstring).

    :param trainer_logprobs: ``[B, T]`` the trainer's log-probs of the sampled tokens, before any update.
    :param rollout_logprobs: ``[B, T]`` the engine's log-probs of the same tokens.
    :param mask: ``[B, T]`` 1.0 where a token is trained on.
    :returns: ``{}`` when no token is trained on.
    """
    mask = mask.float()
    count = int(mask.sum())
    if not count:
        return {}
    trainer, engine = trainer_logprobs.detach().float(), rollout_logprobs.detach().float()

    def token_mean(values: torch.Tensor) -> float:
        return float(algorithms.aggregate(values, mask, "token-mean", total_tokens=count, total_samples=len(mask)))

    log_ratio = (trainer - engine).clamp(-algorithms.LOG_RATIO_LIMIT, algorithms.LOG_RATIO_LIMIT)
    abs_diff = token_mean((trainer - engine).abs())
    return {
        "mismatch_kl": token_mean(algorithms.kl_estimate(engine, trainer, "k3")),
        "logprob_abs_diff_mean": abs_diff,
        "mismatch_abs_diff": abs_diff,
        "token_prob_ratio_max": float(log_ratio.exp()[mask > 0].max()),
        "mismatch_ratio_mean": token_mean(log_ratio.exp()),
    }


def policy_kl(batch: LossBatch, logprobs: torch.Tensor) -> float:
    """``ppo_kl`` of a micro-batch: the k3 estimate of KL(old policy || current policy), summed
    over the micro-batch's trained tokens and divided by the step's ``total_tokens`` (so the
    micro-batches of an update add up to the update's token mean, like every loss metric).

    Every micro-batch of an optimizer update runs its forward pass before the update's optimizer
    step, so for the first update of a step it is exactly the first micro-batch's figure: 0 when
    the trainer's old log-probs come from the same weights and the same computation (on-policy).
    """
    kl = algorithms.kl_estimate(batch.old_logprobs, logprobs.detach(), "k3")
    return float(algorithms.aggregate(kl, batch.response_mask, "token-mean", total_tokens=batch.total_tokens,
                                      total_samples=batch.total_samples))


__all__ = ["policy_kl", "step_mismatch_metrics"]
