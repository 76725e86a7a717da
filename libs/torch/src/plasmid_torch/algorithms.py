"""The RL math that loss plugins share (imports torch): advantages (group-relative,
leave-one-out, turn-level, discounted returns, GAE, whitening, reward shaping), policy losses (PPO-clip,
GSPO's sequence ratio, CISPO), rollout/train mismatch correction (TIS, IcePop/MIS, at token or
sequence level), the critic's value loss, KL estimators, and loss aggregation.

Not imported by ``import plasmid``; loss plugins import it. One definition keeps variants of
one family (GRPO, Dr. GRPO, DAPO, GSPO, CISPO, RLOO, PPO, REINFORCE++) comparable: they differ
in which of these they call and with which arguments, not in how each is computed.

Shapes: ``B`` samples, ``T`` padded response tokens. Per-token tensors are float32 ``[B, T]``
and ``mask`` is ``1.0`` where a token is trained on, ``0.0`` elsewhere (padding, tool output).
Functions never read values at masked positions in a way that can turn a loss or gradient
non-finite: log-ratios are clamped before ``exp``.
"""

from __future__ import annotations

from collections.abc import Callable
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

#: Added to the variance when whitening advantages (verl and OpenRLHF use 1e-8).
WHITEN_EPS = 1e-8

KL_ESTIMATORS = ("k1", "k2", "k3", "low-var-kl")
LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
#: How :func:`rollout_correction` treats a token whose train/rollout ratio leaves the band:
#: ``truncate`` clamps its weight into the band (TIS), ``mask`` drops it (IcePop).
ROLLOUT_CORRECTIONS = ("truncate", "mask")
#: Whose ratio :func:`rollout_correction` weighs a token by (``--tis-mode``): its own, the whole
#: sequence's product, or the sequence's per-token geometric mean.
ROLLOUT_CORRECTION_LEVELS = ("token", "sequence", "geometric")


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


def leave_one_out_advantages(rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """RLOO (Ahmadian et al. 2024): each reward less the mean of the *other* rewards of its group,
    ``r_i - (sum_g - r_i) / (n_g - 1)``, which equals ``n_g / (n_g - 1) * (r_i - mean_g)``.

    :param rewards: ``[B]`` float, one scalar reward per sample.
    :param group_index: ``[B]`` int, samples of one prompt share a value.
    :returns: ``[B]`` float32; a group of one sample has advantage 0.
    """
    centered = group_normalized_rewards(rewards, group_index, scale_by_std=False)
    _, member_of = torch.unique(group_index, return_inverse=True)
    count = torch.zeros(int(member_of.max()) + 1 if member_of.numel() else 0).index_add_(
        0, member_of, torch.ones_like(centered))[member_of]
    return torch.where(count > 1, centered * count / (count - 1).clamp(min=1), torch.zeros_like(centered))


def turn_returns(turn_rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """Each turn's return, ``G_k = r_k + gamma * G_{k+1}``: its own reward and the discounted
    rewards of the sample's later turns.

    :param turn_rewards: ``[B, K]`` float, ``nan`` past a sample's last turn (they stay ``nan``).
    :param gamma: discount per turn, in [0, 1].
    :returns: ``[B, K]`` float32.
    """
    turn_rewards = turn_rewards.float()
    returns = torch.full_like(turn_rewards, float("nan"))
    running = torch.zeros(turn_rewards.shape[0], dtype=torch.float32, device=turn_rewards.device)
    for k in reversed(range(turn_rewards.shape[-1])):
        present = ~torch.isnan(turn_rewards[:, k])
        running = torch.where(present, turn_rewards[:, k] + gamma * running, torch.zeros_like(running))
        returns[:, k] = torch.where(present, running, returns[:, k])
    return returns


def turn_group_advantages(returns: torch.Tensor, group_index: torch.Tensor,
                          relative: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], *,
                          by_turn: bool) -> torch.Tensor:
    """Turn-level advantages: each turn's return relative to others of its group.

    ``relative(values [N], keys [N]) -> [N]`` is the group comparison of a sequence-level loss
    (:func:`group_normalized_rewards`, :func:`leave_one_out_advantages`), applied to the turns'
    returns with one key per comparison set: with ``by_turn`` the turns of the same index in the
    samples of one group (turn 0 with turn 0, ...; a turn index that only one sample reached has
    nothing to compare with and gets what ``relative`` gives a set of one, 0 for those two);
    without it all turns of all samples of the group.

    :param returns: ``[B, K]`` (:func:`turn_returns`), ``nan`` past a sample's last turn.
    :param group_index: ``[B]`` int, samples of one prompt share a value.
    :returns: ``[B, K]`` float32, 0 past a sample's last turn.
    """
    present = ~torch.isnan(returns)
    rows, turns = present.nonzero(as_tuple=True)
    _, member_of = torch.unique(group_index, return_inverse=True)
    keys = member_of[rows] * returns.shape[-1] + turns if by_turn else member_of[rows]
    advantages = torch.zeros_like(returns, dtype=torch.float32)
    advantages[rows, turns] = relative(returns[rows, turns].float(), keys).float()
    return advantages


def turns_to_tokens(per_turn: torch.Tensor, turn_index: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B, K]`` per-turn values on each response token of the turn (``turn_index [B, T]``),
    zeroed where ``mask`` is 0: ``[B, T]`` float32."""
    return torch.gather(per_turn.float(), 1, turn_index.long()) * mask


def whiten(values: torch.Tensor, mask: torch.Tensor, *, eps: float = WHITEN_EPS) -> torch.Tensor:
    """``(x - mean) / sqrt(var + eps)`` over the trained tokens of the whole batch (global
    advantage whitening, as in REINFORCE++ and PPO).

    ``mean`` and the unbiased ``var`` are taken over positions where ``mask`` is 1; the result
    is 0 where ``mask`` is 0. With fewer than two trained tokens the result is ``x - mean``.

    :param values: ``[B, T]``; :param mask: ``[B, T]``. :returns: ``[B, T]`` float32.
    """
    values = values.float()
    trained = mask > 0
    count = trained.sum()
    if count == 0:
        return torch.zeros_like(values)
    masked = torch.where(trained, values, torch.zeros_like(values))
    mean = masked.sum() / count
    centered = torch.where(trained, values - mean, torch.zeros_like(values))
    if count < 2:
        return centered
    var = centered.square().sum() / (count - 1)
    return centered * torch.rsqrt(var + eps)


def response_lengths(mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` int64: one past the last trained token of each sample (0 when none is trained).

    For single-turn samples this is the response length; a multi-turn sample's masked tool
    output before its last trained token is counted, masked tokens after it are not.
    """
    positions = torch.arange(1, mask.shape[-1] + 1, device=mask.device).expand_as(mask)
    return torch.where(mask > 0, positions, torch.zeros_like(positions)).amax(-1)


def overlong_penalty(lengths: torch.Tensor, *, max_length: int, buffer_length: int,
                     penalty_factor: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025), added to each sample's reward.

    With ``L = max_length`` and ``b = buffer_length``, a response of ``l`` tokens gets::

        0                                   when l <= L - b
        -penalty_factor * (l - (L - b)) / b  when l > L - b      (so -penalty_factor at l = L)

    :param lengths: ``[B]`` response lengths in tokens (:func:`response_lengths`).
    :param max_length: the response length limit (``--max-new-tokens``).
    :param buffer_length: ``0 < b <= L`` (``--overlong-buffer-len``).
    :returns: ``[B]`` float32 penalties, each ``<= 0``.
    """
    if not 0 < buffer_length <= max_length:
        raise ValueError(f"the overlong buffer must be in (0, max length {max_length}], got {buffer_length} "
                         f"(--overlong-buffer-len, --max-new-tokens)")
    exceed = lengths.float() - (max_length - buffer_length)
    return (-exceed / buffer_length * penalty_factor).clamp(max=0.0)


def last_token_mask(mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` float: 1.0 at each sample's last trained token, 0 elsewhere (a row with no
    trained token is all 0)."""
    lengths = response_lengths(mask)
    positions = torch.arange(1, mask.shape[-1] + 1, device=mask.device)
    return (positions.unsqueeze(0) == lengths.unsqueeze(-1)).float()


def token_level_rewards(rewards: torch.Tensor, mask: torch.Tensor, *, kl: torch.Tensor | None = None,
                        kl_coef: float = 0.0) -> torch.Tensor:
    """Per-token rewards of PPO and REINFORCE++: ``-kl_coef * kl`` on every trained token, plus
    the sample's scalar reward on its last trained token.

    :param rewards: ``[B]`` scalar rewards.
    :param mask: ``[B, T]``.
    :param kl: ``[B, T]`` per-token KL estimate to the reference (``None``: no penalty).
    :returns: ``[B, T]`` float32, 0 where ``mask`` is 0.
    """
    token_rewards = last_token_mask(mask) * rewards.float().unsqueeze(-1)
    if kl is not None and kl_coef:
        token_rewards = token_rewards - kl_coef * torch.where(mask > 0, kl.float(), torch.zeros_like(token_rewards))
    return token_rewards


def discounted_returns(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """``G_t = r_t + gamma * G_next`` over each sample's trained tokens, from the last back.

    ``next`` is the next *trained* token: masked positions (tool output, padding) are skipped,
    not counted as steps, and get 0.

    :param token_rewards: ``[B, T]``; :param mask: ``[B, T]``; :param gamma: discount in [0, 1].
    :returns: ``[B, T]`` float32.
    """
    returns = torch.zeros_like(token_rewards, dtype=torch.float32)
    running = torch.zeros(token_rewards.shape[0], dtype=torch.float32, device=token_rewards.device)
    for t in reversed(range(token_rewards.shape[-1])):
        trained = mask[:, t] > 0
        running = torch.where(trained, token_rewards[:, t].float() + gamma * running, running)
        returns[:, t] = torch.where(trained, running, torch.zeros_like(running))
    return returns


def gae(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, *, gamma: float,
        lambd: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016) over each sample's trained tokens.

    With ``t'`` the next trained token after ``t`` (``V(t') = 0`` and ``A(t') = 0`` past the last)::

        delta_t = r_t + gamma * V(t') - V(t)
        A_t     = delta_t + gamma * lambd * A(t')
        R_t     = A_t + V(t)                       (the critic's target)

    Masked positions are skipped (not steps) and get 0 in both outputs.

    :param token_rewards: ``[B, T]`` (:func:`token_level_rewards`).
    :param values: ``[B, T]`` the critic's values before the update.
    :param mask: ``[B, T]``.
    :returns: ``(advantages [B, T], returns [B, T])`` float32.
    """
    values = values.float()
    advantages = torch.zeros_like(values)
    zeros = torch.zeros(values.shape[0], dtype=torch.float32, device=values.device)
    next_value, next_advantage = zeros, zeros
    for t in reversed(range(values.shape[-1])):
        trained = mask[:, t] > 0
        delta = token_rewards[:, t].float() + gamma * next_value - values[:, t]
        advantage = delta + gamma * lambd * next_advantage
        advantages[:, t] = torch.where(trained, advantage, zeros)
        next_value = torch.where(trained, values[:, t], next_value)
        next_advantage = torch.where(trained, advantage, next_advantage)
    returns = torch.where(mask > 0, advantages + values, torch.zeros_like(values))
    return advantages, returns


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


def sequence_level_logprobs(logprobs: torch.Tensor, old_logprobs: torch.Tensor,
                            mask: torch.Tensor) -> torch.Tensor:
    """Per-token log-probs whose ratio to ``old_logprobs`` is the sequence-level ratio of GSPO
    (Zheng et al. 2025), for :func:`ppo_clip_loss`.

    With ``s_i = exp(mean over trained tokens of (logprobs - old_logprobs))``, the result at a
    trained token is ``old + log(sg(s_i)) + logprobs - sg(logprobs)``: its ratio equals ``s_i``
    for every token of the sample (so the clip acts on whole sequences) and its gradient flows
    through the token's own log-prob (GSPO-token). Averaged per sequence, the gradient equals
    that of ``s_i`` itself. Masked positions get ``old_logprobs`` (ratio 1, no gradient).

    :returns: ``[B, T]`` float32.
    """
    trained = mask > 0
    log_ratio = torch.where(trained, logprobs - old_logprobs, torch.zeros_like(logprobs))
    sequence_log_ratio = log_ratio.sum(-1) / mask.sum(-1).clamp(min=1)
    effective = old_logprobs + sequence_log_ratio.detach().unsqueeze(-1) + logprobs - logprobs.detach()
    return torch.where(trained, effective, old_logprobs)


def cispo_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, *,
               eps_clip: float, eps_clip_high: float | None = None) -> ClippedPolicyLoss:
    """CISPO (MiniMax-M1, 2025): the clipped importance weight, without gradient, times the
    advantage and the log-prob, per token::

        loss = -sg(clip(r, 1 - eps_clip, 1 + eps_clip_high)) * A * logprobs

    Unlike PPO-clip no token loses its gradient; a clipped weight only bounds its size.
    ``clipped`` marks tokens whose weight was clamped; ``dual_clipped`` is all 0.
    """
    if eps_clip_high is None:
        eps_clip_high = eps_clip
    log_ratio = (logprobs - old_logprobs).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    ratio = log_ratio.exp()
    low, high = 1 - eps_clip, 1 + eps_clip_high
    weight = ratio.detach().clamp(low, high)
    loss = -weight * advantages * logprobs
    clipped = ((ratio.detach() < low) | (ratio.detach() > high)).float()
    return ClippedPolicyLoss(loss, clipped, torch.zeros_like(loss), ratio)


# -------------------------------------------------------------------------------------------------
# Rollout / train mismatch
# -------------------------------------------------------------------------------------------------


class RolloutCorrection(NamedTuple):
    """Per-token importance weights that correct for the engine sampling from a slightly
    different distribution than the trainer computes, all ``[B, T]`` without gradient.

    :ivar weights: multiply the per-token policy loss by these.
    :ivar outside: 1.0 where the ratio was outside the band (truncated or masked).
    :ivar ratio: ``exp(old_logprobs - rollout_logprobs)``, after clamping the log-ratio.
    """

    weights: torch.Tensor
    outside: torch.Tensor
    ratio: torch.Tensor


def rollout_correction(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, *, low: float, high: float,
                       mode: str = "truncate", level: str = "token",
                       mask: torch.Tensor | None = None) -> RolloutCorrection:
    """Truncated importance sampling (TIS, Yao et al. 2025) or masked importance sampling (MIS;
    IcePop at token level), at token or sequence level (slime's and verl's rollout correction).

    With ``d = old_logprobs - rollout_logprobs`` (trainer over engine log-probability of each
    sampled token), the importance ratio ``w`` of a token is, by ``level``:

    - ``token``: ``exp(d)`` of the token itself;
    - ``sequence``: ``exp(sum of d over the sample's trained tokens)``, the ratio of the whole
      response's probabilities, the same for each of its tokens;
    - ``geometric``: ``exp(mean of d over the sample's trained tokens)``, the per-token geometric
      mean of the sequence ratio (length-independent), the same for each of its tokens.

    Each log-ratio is clamped to ``[-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT]`` before ``exp``. Then, by ``mode``:

    - ``truncate``: weight ``clamp(w, low, high)`` (TIS);
    - ``mask``: weight ``w`` inside ``[low, high]`` and 0 outside (MIS: the token, or at sequence
      level the whole sample, is dropped).

    :param old_logprobs: ``[B, T]`` the trainer's log-probs of the policy that sampled.
    :param rollout_logprobs: ``[B, T]`` the engine's log-probs of the same tokens.
    :param low: lower edge of the band (``--tis-clip-low``); :param high: upper (``--tis-clip``).
    :param mode: one of :data:`ROLLOUT_CORRECTIONS`.
    :param level: one of :data:`ROLLOUT_CORRECTION_LEVELS` (``--tis-mode``).
    :param mask: ``[B, T]`` trained tokens; needed by the sequence levels (masked tokens never
        enter a sequence's ratio).
    """
    if mode not in ROLLOUT_CORRECTIONS:
        raise ValueError(f"unknown rollout correction {mode!r}; choose one of {ROLLOUT_CORRECTIONS}")
    if level not in ROLLOUT_CORRECTION_LEVELS:
        raise ValueError(f"unknown rollout correction level {level!r} (--tis-mode); choose one of "
                         f"{ROLLOUT_CORRECTION_LEVELS}")
    if not 0 <= low < high:
        raise ValueError(f"the importance-weight band needs 0 <= low < high, got [{low}, {high}] "
                         f"(--tis-clip-low, --tis-clip)")
    log_ratio = old_logprobs.detach().float() - rollout_logprobs.float()
    if level != "token":
        if mask is None:
            raise ValueError(f"the {level} rollout correction needs the response mask")
        trained = mask > 0
        summed = torch.where(trained, log_ratio, torch.zeros_like(log_ratio)).sum(-1)
        if level == "geometric":
            summed = summed / trained.sum(-1).clamp(min=1)
        log_ratio = summed.unsqueeze(-1).expand_as(log_ratio)
    ratio = log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT).exp()
    outside = (ratio < low) | (ratio > high)
    if mode == "truncate":
        weights = ratio.clamp(low, high)
    else:
        weights = torch.where(outside, torch.zeros_like(ratio), ratio)
    return RolloutCorrection(weights, outside.float(), ratio)


# -------------------------------------------------------------------------------------------------
# Critic
# -------------------------------------------------------------------------------------------------


class ClippedValueLoss(NamedTuple):
    """Per-token terms of the clipped value loss, ``[B, T]``.

    :ivar loss: ``0.5 * max((V - R)^2, (V_clipped - R)^2)`` (to minimise).
    :ivar clipped: 1.0 where the clipped term was the larger one (the gradient is cut).
    """

    loss: torch.Tensor
    clipped: torch.Tensor


def clipped_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, *,
                       value_clip: float | None) -> ClippedValueLoss:
    """PPO's value loss, with the new values kept within ``value_clip`` of the old ones::

        V_clipped = old + clamp(V - old, -value_clip, value_clip)
        loss      = 0.5 * max((V - R)^2, (V_clipped - R)^2)

    :param values: ``[B, T]`` the critic's current values (with gradient).
    :param old_values: ``[B, T]`` its values before the update (``LossBatch.values``).
    :param returns: ``[B, T]`` targets (``LossBatch.returns``).
    :param value_clip: ``None`` or ``<= 0``: the plain ``0.5 * (V - R)^2``.
    """
    unclipped = (values - returns).square()
    if value_clip is None or value_clip <= 0:
        return ClippedValueLoss(0.5 * unclipped, torch.zeros_like(unclipped))
    clipped_values = old_values + (values - old_values).clamp(-value_clip, value_clip)
    clipped = (clipped_values - returns).square()
    return ClippedValueLoss(0.5 * torch.maximum(unclipped, clipped), (clipped > unclipped).float())


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """``1 - Var[R - V] / Var[R]`` over trained tokens (population variances): 1 when the critic
    predicts the returns exactly, 0 when it does no better than their mean, negative when worse.
    Returns 0.0 when the returns do not vary (there is nothing to explain)."""
    trained = mask > 0
    if trained.sum() == 0:
        return 0.0
    targets, predictions = returns[trained].double(), values[trained].double()
    spread = float(targets.var(unbiased=False))
    if spread <= 0:
        return 0.0
    return 1.0 - float((targets - predictions).var(unbiased=False)) / spread


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
    "ROLLOUT_CORRECTIONS",
    "ROLLOUT_CORRECTION_LEVELS",
    "WHITEN_EPS",
    "ClippedPolicyLoss",
    "ClippedValueLoss",
    "RolloutCorrection",
    "aggregate",
    "broadcast_to_tokens",
    "cispo_loss",
    "clipped_value_loss",
    "discounted_returns",
    "explained_variance",
    "gae",
    "group_normalized_rewards",
    "kl_estimate",
    "last_token_mask",
    "leave_one_out_advantages",
    "overlong_penalty",
    "ppo_clip_loss",
    "response_lengths",
    "rollout_correction",
    "sequence_level_logprobs",
    "sequence_sum",
    "token_level_rewards",
    "turn_group_advantages",
    "turn_returns",
    "turns_to_tokens",
    "whiten",
]
