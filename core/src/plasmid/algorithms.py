"""The RL math that loss plugins share: advantages, the clipped policy loss, KL estimators,
and loss aggregation (imports torch).

Not imported by ``import plasmid``; loss plugins import it. One definition keeps variants of
one family (GRPO, Dr. GRPO, DAPO, GSPO, PPO) comparable: they differ in which of these they call
and with which arguments, not in how each is computed.

Shapes: ``B`` samples, ``T`` padded response tokens. Per-token tensors are float32 ``[B, T]``
and ``mask`` is ``1.0`` where a token is trained on, ``0.0`` elsewhere (padding, tool output).
Functions never read values at masked positions in a way that can turn a loss or gradient
non-finite: log-ratios are clamped before ``exp``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

#: Default epsilon added to a group's standard deviation. slime and verl use 1e-6; a reward
#: spread of 1e-6 is then scaled to ~0.5. (An earlier raw training loop of ours used 1e-4; for
#: 0/1 rewards and groups of 2 or more the two differ by under 0.1% of the advantage.)
GROUP_STD_EPS = 1e-6

#: Log-ratios are clamped to ``[-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT]`` before ``exp``, so that a
#: ratio is at most ``e**20`` and never ``inf`` (whose gradient times a zero mask is ``nan``).
LOG_RATIO_LIMIT = 20.0

#: ``low-var-kl`` clamps the k3 estimate to ``[-LOW_VAR_KL_LIMIT, LOW_VAR_KL_LIMIT]``.
LOW_VAR_KL_LIMIT = 10.0

KL_ESTIMATORS = ("k1", "k2", "k3", "low-var-kl")
LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


# -------------------------------------------------------------------------------------------------
# Advantages
# -------------------------------------------------------------------------------------------------


def group_normalized_rewards(rewards: torch.Tensor, group_index: torch.Tensor, *, scale_by_std: bool = True,
                             eps: float = GROUP_STD_EPS) -> torch.Tensor:
    """Each reward relative to its group: ``(r - mean_g) / (std_g + eps)``.

    ``std_g`` is the unbiased (Bessel-corrected, ``torch.std``'s default) standard deviation of
    the group's rewards; a group of one sample has advantage 0.

    :param rewards: ``[B]`` float, one scalar reward per sample.
    :param group_index: ``[B]`` int, samples of one prompt share a value (any integers, any order).
    :param scale_by_std: ``False`` returns ``r - mean_g`` (Dr. GRPO).
    :param eps: added to ``std_g`` (see :data:`GROUP_STD_EPS`).
    :returns: ``[B]`` float32 advantages; every group's values sum to 0.
    """
    rewards = rewards.float()
    if rewards.dim() != 1 or group_index.shape != rewards.shape:
        raise ValueError(f"rewards and group_index must both be [B]; got {tuple(rewards.shape)} "
                         f"and {tuple(group_index.shape)}")
    _, member_of = torch.unique(group_index, return_inverse=True)
    groups = int(member_of.max()) + 1 if member_of.numel() else 0
    count = torch.zeros(groups, dtype=rewards.dtype).index_add_(0, member_of, torch.ones_like(rewards))
    mean = torch.zeros(groups, dtype=rewards.dtype).index_add_(0, member_of, rewards) / count
    centered = rewards - mean[member_of]
    if not scale_by_std:
        return centered
    squares = torch.zeros(groups, dtype=rewards.dtype).index_add_(0, member_of, centered * centered)
    std = (squares / (count - 1).clamp(min=1)).sqrt()
    return centered / (std[member_of] + eps)


def broadcast_to_tokens(per_sample: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` values repeated over each sample's tokens and zeroed where ``mask`` is 0: ``[B, T]``."""
    return per_sample.float().unsqueeze(-1) * mask


# -------------------------------------------------------------------------------------------------
# Policy loss
# -------------------------------------------------------------------------------------------------


class ClippedPolicyLoss(NamedTuple):
    """Per-token terms of the PPO-clip objective, all ``[B, T]``.

    :ivar loss: the per-token loss to aggregate (to minimise).
    :ivar clipped: 1.0 where the clipped term was the active one (the gradient is cut).
    :ivar dual_clipped: 1.0 where the dual-clip bound ``c`` was the active one.
    :ivar ratio: ``exp(logprobs - old_logprobs)``, after clamping the log-ratio.
    """

    loss: torch.Tensor
    clipped: torch.Tensor
    dual_clipped: torch.Tensor
    ratio: torch.Tensor


def ppo_clip_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, *,
                  eps_clip: float, eps_clip_high: float | None = None,
                  dual_clip_c: float | None = None) -> ClippedPolicyLoss:
    """The PPO-clip loss per token, with an asymmetric range and optional dual clip.

    With ``r = exp(logprobs - old_logprobs)`` and advantage ``A``::

        loss = max(-A * r, -A * clip(r, 1 - eps_clip, 1 + eps_clip_high))
        loss = min(loss, -A * c)            where A < 0, when dual_clip_c is given

    :param logprobs: ``[B, T]`` log-probs under the policy being trained (with gradient).
    :param old_logprobs: ``[B, T]`` log-probs under the policy that produced the batch.
    :param advantages: ``[B, T]``.
    :param eps_clip: lower clip range (``r >= 1 - eps_clip``).
    :param eps_clip_high: upper clip range; ``None`` means ``eps_clip`` (DAPO's "clip higher"
        sets it larger).
    :param dual_clip_c: ``c > 1`` bounds the loss of negative-advantage tokens by ``-A * c``
        (Ye et al. 2020); ``None`` disables it.
    """
    if eps_clip_high is None:
        eps_clip_high = eps_clip
    if dual_clip_c is not None and dual_clip_c <= 1:
        raise ValueError(f"the dual-clip bound c must be > 1, got {dual_clip_c} (--eps-clip-c)")
    log_ratio = (logprobs - old_logprobs).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - eps_clip, 1 + eps_clip_high)
    loss = torch.maximum(unclipped, clipped)
    was_clipped = (clipped > unclipped).float()
    dual_clipped = torch.zeros_like(loss)
    if dual_clip_c is not None:
        bound = -advantages * dual_clip_c
        dual_active = (advantages < 0) & (loss > bound)
        loss = torch.where(dual_active, bound, loss)
        dual_clipped = dual_active.float()
    return ClippedPolicyLoss(loss, was_clipped, dual_clipped, ratio)


# -------------------------------------------------------------------------------------------------
# KL estimators
# -------------------------------------------------------------------------------------------------


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of ``KL(policy || reference)`` from the sampled tokens' log-probs.

    With ``d = logprobs - ref_logprobs`` (Schulman, "Approximating KL divergence"):

    - ``k1``: ``d`` (unbiased, high variance, can be negative);
    - ``k2``: ``d**2 / 2``;
    - ``k3``: ``exp(-d) - 1 + d`` (unbiased, non-negative);
    - ``low-var-kl``: ``k3`` with ``d`` clamped to ``[-20, 20]`` and the result clamped to
      ``[-10, 10]``.

    :param logprobs: ``[...]`` the policy's log-probs (may carry gradient).
    :param ref_logprobs: ``[...]`` the reference's log-probs of the same tokens.
    :returns: ``[...]`` float32; masked positions are not zeroed (aggregate with a mask).
    """
    log_ratio = logprobs.float() - ref_logprobs.float()
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    if estimator == "k3":
        return torch.expm1(-log_ratio) + log_ratio
    if estimator == "low-var-kl":
        log_ratio = log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
        return (torch.expm1(-log_ratio) + log_ratio).clamp(-LOW_VAR_KL_LIMIT, LOW_VAR_KL_LIMIT)
    raise ValueError(f"unknown KL estimator {estimator!r} (--kl-estimator); choose one of {KL_ESTIMATORS}")


def sequence_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum over each sample's trained tokens: ``[B, T] -> [B]``."""
    return torch.where(mask > 0, values, torch.zeros_like(values)).sum(-1)


# -------------------------------------------------------------------------------------------------
# Aggregation
# -------------------------------------------------------------------------------------------------


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: str, *, total_tokens: int, total_samples: int,
              max_response_length: int | None = None) -> torch.Tensor:
    """Reduce per-token ``values`` ``[B, T]`` to a scalar, normalised by whole-step totals.

    The normalisers are the totals of the whole optimizer step, not of ``values``; so the
    results for the micro-batches of a step add up to the result for the whole step, and
    accumulating their gradients equals one big batch's gradient.

    - ``token-mean``: ``sum(values * mask) / total_tokens`` (every token weighs the same);
    - ``seq-mean-token-mean``: each sample's mean over its tokens, summed, ``/ total_samples``
      (every sample weighs the same);
    - ``seq-mean-token-sum-norm``: each sample's sum over its tokens divided by
      ``max_response_length``, summed, ``/ total_samples`` (Dr. GRPO: no length bias).

    :param values: ``[B, T]`` per-token values.
    :param mask: ``[B, T]`` 1.0 where a token counts.
    :param total_tokens: trained tokens in the step (``LossBatch.total_tokens``); at least 1 is used.
    :param total_samples: samples in the step (``LossBatch.total_samples``); at least 1 is used.
    :param max_response_length: the constant of ``seq-mean-token-sum-norm``; default ``T``.
    :returns: a 0-dim float tensor.
    """
    masked = torch.where(mask > 0, values, torch.zeros_like(values))
    if mode == "token-mean":
        return masked.sum() / max(int(total_tokens), 1)
    if mode == "seq-mean-token-mean":
        per_sample = masked.sum(-1) / mask.sum(-1).clamp(min=1)
        return per_sample.sum() / max(int(total_samples), 1)
    if mode == "seq-mean-token-sum-norm":
        length = max_response_length if max_response_length is not None else values.shape[-1]
        per_sample = masked.sum(-1) / max(int(length), 1)
        return per_sample.sum() / max(int(total_samples), 1)
    raise ValueError(f"unknown loss aggregation {mode!r} (--loss-agg); choose one of {LOSS_AGGREGATIONS}")


__all__ = [
    "GROUP_STD_EPS",
    "KL_ESTIMATORS",
    "LOSS_AGGREGATIONS",
    "ClippedPolicyLoss",
    "aggregate",
    "broadcast_to_tokens",
    "group_normalized_rewards",
    "kl_estimate",
    "ppo_clip_loss",
    "sequence_sum",
]
