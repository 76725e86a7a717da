"""plasmid_torch.algorithms against closed forms worked out by hand on tiny tensors."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from plasmid_torch import algorithms  # noqa: E402

SQRT2, SQRT3 = math.sqrt(2.0), math.sqrt(3.0)


def close(actual, expected, tol=1e-6):
    return torch.allclose(actual, torch.tensor(expected, dtype=torch.float32), atol=tol, rtol=0)


# ------------------------------------------------------------------------------------------------
# group-normalised rewards
# ------------------------------------------------------------------------------------------------


def test_group_advantage_uses_unbiased_std():
    # group 0 = [1, 0, 0, 1]: mean 0.5, unbiased var (4 * 0.25) / 3 = 1/3, std 1/sqrt(3)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    advantages = algorithms.group_normalized_rewards(rewards, torch.tensor([0, 0, 0, 0]), eps=0.0)
    half_sqrt3 = 0.5 * SQRT3
    assert close(advantages, [half_sqrt3, -half_sqrt3, -half_sqrt3, half_sqrt3])


def test_group_advantage_adds_eps_to_the_std():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    advantages = algorithms.group_normalized_rewards(rewards, torch.zeros(4, dtype=torch.long), eps=1e-4)
    expected = 0.5 / (1 / SQRT3 + 1e-4)
    assert close(advantages, [expected, -expected, -expected, expected])


def test_groups_are_told_apart_by_index_in_any_order():
    # group 3 = [1, 3]: mean 2, std sqrt(2);  group 1 = [2, 6]: mean 4, std sqrt(8)
    rewards = torch.tensor([1.0, 2.0, 3.0, 6.0])
    advantages = algorithms.group_normalized_rewards(rewards, torch.tensor([3, 1, 3, 1]), eps=0.0)
    assert close(advantages, [-1 / SQRT2, -1 / SQRT2, 1 / SQRT2, 1 / SQRT2])


def test_constant_and_single_sample_groups_have_zero_advantage():
    rewards = torch.tensor([5.0, 5.0, 2.0])
    advantages = algorithms.group_normalized_rewards(rewards, torch.tensor([0, 0, 1]))
    assert torch.equal(advantages, torch.zeros(3))


def test_without_std_scaling_the_advantage_is_reward_minus_group_mean():
    rewards = torch.tensor([1.0, 3.0, 2.0, 6.0])
    advantages = algorithms.group_normalized_rewards(rewards, torch.tensor([0, 0, 1, 1]), scale_by_std=False)
    assert close(advantages, [-1.0, 1.0, -2.0, 2.0])


def test_broadcast_to_tokens_zeroes_masked_positions():
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]])
    assert close(algorithms.broadcast_to_tokens(torch.tensor([2.0, -1.0]), mask), [[2, 2, 0], [0, -1, -1]])


# ------------------------------------------------------------------------------------------------
# PPO clip
# ------------------------------------------------------------------------------------------------


def ratios_to_logprobs(ratios):
    """logprobs with old_logprobs = 0, so that exp(logprobs - old) == ratios."""
    logprobs = torch.log(torch.tensor(ratios, dtype=torch.float32)).requires_grad_(True)
    return logprobs, torch.zeros_like(logprobs)


def test_ppo_clip_cuts_the_side_the_advantage_pushes_towards():
    # A=+1, r=1.5: max(-1.5, -1.2) = -1.2 (clipped)   A=+1, r=0.5: max(-0.5, -0.8) = -0.5
    # A=-1, r=1.5: max(1.5, 1.2) = 1.5                A=-1, r=0.5: max(0.5, 0.8) = 0.8 (clipped)
    logprobs, old = ratios_to_logprobs([[1.5, 0.5, 1.5, 0.5]])
    advantages = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    terms = algorithms.ppo_clip_loss(logprobs, old, advantages, eps_clip=0.2)
    assert close(terms.loss, [[-1.2, -0.5, 1.5, 0.8]], tol=1e-5)
    assert close(terms.clipped, [[1.0, 0.0, 0.0, 1.0]])
    assert close(terms.ratio, [[1.5, 0.5, 1.5, 0.5]], tol=1e-6)
    # d(-A r)/d logprob = -A r where unclipped, 0 where clipped
    terms.loss.sum().backward()
    assert close(logprobs.grad, [[0.0, -0.5, 1.5, 0.0]], tol=1e-5)


def test_ppo_clip_high_widens_only_the_upper_side():
    logprobs, old = ratios_to_logprobs([[1.5, 0.5]])
    advantages = torch.tensor([[1.0, -1.0]])
    terms = algorithms.ppo_clip_loss(logprobs, old, advantages, eps_clip=0.2, eps_clip_high=0.28)
    assert close(terms.loss, [[-1.28, 0.8]], tol=1e-5)


def test_dual_clip_bounds_negative_advantage_losses_by_c():
    # A=-1, r=5: PPO loss max(5, 1.2) = 5, bounded by -A c = 3.   A=-2, r=1: loss 2 < 6, untouched.
    # A=+1, r=5: -1.2 (clipped), dual clip never applies to positive advantages.
    logprobs, old = ratios_to_logprobs([[5.0, 1.0, 5.0]])
    advantages = torch.tensor([[-1.0, -2.0, 1.0]])
    terms = algorithms.ppo_clip_loss(logprobs, old, advantages, eps_clip=0.2, dual_clip_c=3.0)
    assert close(terms.loss, [[3.0, 2.0, -1.2]], tol=1e-5)
    assert close(terms.dual_clipped, [[1.0, 0.0, 0.0]])
    terms.loss.sum().backward()
    assert close(logprobs.grad, [[0.0, 2.0, 0.0]], tol=1e-5)


def test_dual_clip_bound_must_exceed_one():
    logprobs, old = ratios_to_logprobs([[1.0]])
    with pytest.raises(ValueError, match="eps-clip-c"):
        algorithms.ppo_clip_loss(logprobs, old, torch.ones(1, 1), eps_clip=0.2, dual_clip_c=0.5)


def test_huge_log_ratio_gives_finite_loss_and_gradient():
    logprobs = torch.tensor([[500.0]], requires_grad=True)
    terms = algorithms.ppo_clip_loss(logprobs, torch.zeros(1, 1), -torch.ones(1, 1), eps_clip=0.2)
    (terms.loss * 0).sum().backward()
    assert torch.isfinite(terms.loss).all() and torch.isfinite(logprobs.grad).all()


# ------------------------------------------------------------------------------------------------
# KL estimators, with d = logprobs - ref_logprobs
# ------------------------------------------------------------------------------------------------

LN2 = math.log(2.0)


@pytest.mark.parametrize(("estimator", "expected"), [
    ("k1", [LN2, -LN2]),
    ("k2", [0.5 * LN2**2, 0.5 * LN2**2]),
    ("k3", [0.5 - 1 + LN2, 2 - 1 - LN2]),        # exp(-d) - 1 + d
    ("low-var-kl", [0.5 - 1 + LN2, 2 - 1 - LN2]),
])
def test_kl_estimators_closed_forms(estimator, expected):
    logprobs = torch.log(torch.tensor([0.5, 0.25]))
    ref_logprobs = torch.log(torch.tensor([0.25, 0.5]))   # d = [ln 2, -ln 2]
    assert close(algorithms.kl_estimate(logprobs, ref_logprobs, estimator), expected, tol=1e-6)


def test_low_var_kl_is_clamped_to_ten():
    logprobs = torch.tensor([-15.0, 30.0, 0.0])
    ref = torch.zeros(3)
    # k3(-15) = e^15 - 16 and k3(30) = e^-30 + 29: both above 10
    assert close(algorithms.kl_estimate(logprobs, ref, "low-var-kl"), [10.0, 10.0, 0.0])
    assert algorithms.kl_estimate(logprobs, ref, "k3")[0] > 1e6


def test_unknown_kl_estimator_names_the_option():
    with pytest.raises(ValueError, match="--kl-estimator"):
        algorithms.kl_estimate(torch.zeros(1), torch.zeros(1), "k9")


def test_sequence_sum_ignores_masked_tokens():
    values = torch.tensor([[1.0, 2.0, float("nan")], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    assert close(algorithms.sequence_sum(values, mask), [3.0, 6.0])


# ------------------------------------------------------------------------------------------------
# aggregation
# ------------------------------------------------------------------------------------------------

VALUES = [[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]]
MASK = [[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]


def agg(mode, values=VALUES, mask=MASK, **totals):
    totals.setdefault("total_tokens", 3)
    totals.setdefault("total_samples", 2)
    return algorithms.aggregate(torch.tensor(values), torch.tensor(mask), mode, **totals)


def test_token_mean_divides_the_masked_sum_by_the_step_tokens():
    assert close(agg("token-mean"), (1 + 2 + 4) / 3)
    assert close(agg("token-mean", total_tokens=7), (1 + 2 + 4) / 7)


def test_seq_mean_token_mean_weighs_every_sample_equally():
    assert close(agg("seq-mean-token-mean"), ((1 + 2) / 2 + 4 / 1) / 2)
    assert close(agg("seq-mean-token-mean", total_samples=4), ((1 + 2) / 2 + 4 / 1) / 4)


def test_seq_mean_token_sum_norm_divides_by_a_constant_length():
    assert close(agg("seq-mean-token-sum-norm", max_response_length=4), ((1 + 2) / 4 + 4 / 4) / 2)
    assert close(agg("seq-mean-token-sum-norm"), ((1 + 2) / 3 + 4 / 3) / 2)   # default: T = 3


@pytest.mark.parametrize("mode", algorithms.LOSS_AGGREGATIONS)
def test_micro_batch_aggregates_add_up_to_the_full_batch(mode):
    totals = dict(total_tokens=3, total_samples=2, max_response_length=5)
    full = agg(mode, **totals)
    parts = agg(mode, [VALUES[0]], [MASK[0]], **totals) + agg(mode, [VALUES[1]], [MASK[1]], **totals)
    assert close(parts, float(full))


@pytest.mark.parametrize("mode", algorithms.LOSS_AGGREGATIONS)
def test_masked_nan_does_not_reach_the_aggregate_or_its_gradient(mode):
    values = torch.tensor([[1.0, float("nan")], [float("inf"), 2.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    result = algorithms.aggregate(values, mask, mode, total_tokens=2, total_samples=2)
    result.backward()
    assert torch.isfinite(result) and torch.isfinite(values.grad).all()
    assert values.grad[0, 1] == 0 and values.grad[1, 0] == 0


def test_unknown_aggregation_names_the_option():
    with pytest.raises(ValueError, match="--loss-agg"):
        agg("mean-of-everything")


# ------------------------------------------------------------------------------------------------
# leave-one-out, whitening, lengths and overlong shaping
# ------------------------------------------------------------------------------------------------


def test_leave_one_out_advantage_subtracts_the_mean_of_the_other_samples():
    # group 0 = [1, 0, 0, 1]: a 1 is compared with mean(0, 0, 1) = 1/3, a 0 with mean(1, 0, 1) = 2/3
    # group 1 = [2, 5]: 2 - 5 and 5 - 2;   group 2 = [7]: alone, advantage 0
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 5.0, 7.0])
    group_index = torch.tensor([0, 0, 0, 0, 1, 1, 2])
    advantages = algorithms.leave_one_out_advantages(rewards, group_index)
    assert close(advantages, [2 / 3, -2 / 3, -2 / 3, 2 / 3, -3.0, 3.0, 0.0])


def test_turn_returns_discount_later_turns_and_keep_missing_turns_nan():
    nan = float("nan")
    returns = algorithms.turn_returns(torch.tensor([[1.0, -1.0, 2.0], [3.0, nan, nan]]), 0.5)
    assert close(returns[0], [1.0 - 0.5 + 0.5, -1.0 + 1.0, 2.0]) and returns[1, 0] == 3.0
    assert torch.isnan(returns[1, 1:]).all()


def test_turn_group_advantages_compare_the_same_turn_or_all_turns_of_a_group():
    nan = float("nan")
    returns = torch.tensor([[0.0, -1.0], [-1.0, 0.0], [5.0, nan]])     # samples 0, 1 one group; 2 alone
    groups = torch.tensor([7, 7, 3])
    by_turn = algorithms.turn_group_advantages(returns, groups, algorithms.leave_one_out_advantages, by_turn=True)
    assert close(by_turn, [[1.0, -1.0], [-1.0, 1.0], [0.0, 0.0]])
    pooled = algorithms.turn_group_advantages(
        returns, groups, lambda values, keys: algorithms.group_normalized_rewards(values, keys, scale_by_std=False),
        by_turn=False)
    assert close(pooled, [[0.5, -0.5], [-0.5, 0.5], [0.0, 0.0]])


def test_turns_to_tokens_puts_each_turns_value_on_its_tokens_and_zeroes_masked_ones():
    per_turn = torch.tensor([[2.0, -3.0]])
    tokens = algorithms.turns_to_tokens(per_turn, torch.tensor([[0, 0, 1, 1]]), torch.tensor([[1.0, 0.0, 1.0, 1.0]]))
    assert close(tokens, [[2.0, 0.0, -3.0, -3.0]])


def test_whiten_uses_the_trained_tokens_of_the_whole_batch():
    # trained values 1, 2, 3: mean 2, unbiased variance 1; masked positions (9) are ignored and zeroed
    values = torch.tensor([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    scale = 1 / math.sqrt(1 + algorithms.WHITEN_EPS)
    assert close(algorithms.whiten(values, mask), [[-scale, 0.0, 0.0], [scale, 0.0, 0.0]])


def test_response_length_is_one_past_the_last_trained_token():
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    assert algorithms.response_lengths(mask).tolist() == [2, 3, 0]


def test_overlong_penalty_grows_linearly_inside_the_buffer():
    # limit 10, buffer 4: no penalty up to 6 tokens, then -(l - 6) / 4 * factor, -factor at 10
    lengths = torch.tensor([6, 7, 10, 3])
    penalty = algorithms.overlong_penalty(lengths, max_length=10, buffer_length=4, penalty_factor=0.5)
    assert close(penalty, [0.0, -0.125, -0.5, 0.0])
    with pytest.raises(ValueError, match="--overlong-buffer-len"):
        algorithms.overlong_penalty(lengths, max_length=10, buffer_length=11)


# ------------------------------------------------------------------------------------------------
# token-level rewards, discounted returns, GAE
# ------------------------------------------------------------------------------------------------


def test_token_rewards_put_the_reward_on_the_last_trained_token_and_kl_on_every_one():
    rewards = torch.tensor([1.0, 2.0])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
    kl = torch.tensor([[0.1, 0.2, 9.0], [0.3, 9.0, 0.5]])
    token_rewards = algorithms.token_level_rewards(rewards, mask, kl=kl, kl_coef=0.5)
    assert close(token_rewards, [[-0.05, 1 - 0.1, 0.0], [-0.15, 0.0, 2 - 0.25]])


def test_discounted_returns_skip_masked_tokens():
    # gamma 0.5, rewards 1, 2, 4: G = [1 + 0.5 * 4, 2 + 0.5 * 4, 4] = [3, 4, 4]
    assert close(algorithms.discounted_returns(torch.tensor([[1.0, 2.0, 4.0]]), torch.ones(1, 3), 0.5),
                 [[3.0, 4.0, 4.0]])
    # a masked middle token is not a step: G_0 = 1 + 0.5 * G_2
    returns = algorithms.discounted_returns(torch.tensor([[1.0, 99.0, 4.0]]), torch.tensor([[1.0, 0.0, 1.0]]), 0.5)
    assert close(returns, [[3.0, 0.0, 4.0]])


def test_gae_closed_form():
    # gamma 0.9, lambda 0.5, reward 1 on the last token, values 0.5, 0.6, 0.7:
    #   delta_2 = 1 - 0.7 = 0.3                 A_2 = 0.3
    #   delta_1 = 0.9 * 0.7 - 0.6 = 0.03        A_1 = 0.03 + 0.45 * 0.3 = 0.165
    #   delta_0 = 0.9 * 0.6 - 0.5 = 0.04        A_0 = 0.04 + 0.45 * 0.165 = 0.11425
    rewards, values = torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 0.6, 0.7]])
    advantages, returns = algorithms.gae(rewards, values, torch.ones(1, 3), gamma=0.9, lambd=0.5)
    assert close(advantages, [[0.11425, 0.165, 0.3]])
    assert close(returns, [[0.61425, 0.765, 1.0]])


def test_gae_with_gamma_and_lambda_one_is_return_minus_value():
    rewards, values = torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 0.6, 0.7]])
    advantages, returns = algorithms.gae(rewards, values, torch.ones(1, 3), gamma=1.0, lambd=1.0)
    assert close(advantages, [[0.5, 0.4, 0.3]])
    assert close(returns, [[1.0, 1.0, 1.0]])


def test_gae_skips_masked_tokens():
    # the masked middle token (value 99) is not a step: delta_0 = 0.9 * 0.7 - 0.5 = 0.13, A_0 = 0.13 + 0.45 * 0.3
    rewards, values = torch.tensor([[0.0, 5.0, 1.0]]), torch.tensor([[0.5, 99.0, 0.7]])
    advantages, returns = algorithms.gae(rewards, values, torch.tensor([[1.0, 0.0, 1.0]]), gamma=0.9, lambd=0.5)
    assert close(advantages, [[0.265, 0.0, 0.3]])
    assert close(returns, [[0.765, 0.0, 1.0]])


# ------------------------------------------------------------------------------------------------
# GSPO's sequence ratio, CISPO
# ------------------------------------------------------------------------------------------------


def test_sequence_level_ratio_is_the_geometric_mean_of_the_token_ratios():
    # token ratios 4 and 1 (third token masked): s = exp((ln 4 + 0) / 2) = 2 on every trained token
    old = torch.zeros(1, 3)
    logprobs = torch.tensor([[math.log(4.0), 0.0, 7.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    effective = algorithms.sequence_level_logprobs(logprobs, old, mask)
    assert close((effective - old).exp(), [[2.0, 2.0, 1.0]], tol=1e-5)
    # A = -1: unclipped loss -A * s = 2 per token; its per-sequence mean has the gradient of
    # -A * s itself: d s / d logprob_t = s / |y| = 1 on each trained token, 0 on the masked one
    terms = algorithms.ppo_clip_loss(effective, old, -torch.ones(1, 3), eps_clip=0.2)
    ((terms.loss * mask).sum() / 2).backward()
    assert close(logprobs.grad, [[1.0, 1.0, 0.0]], tol=1e-5)
    assert close(terms.clipped * mask, [[0.0, 0.0, 0.0]])


def test_sequence_level_ratio_is_clipped_for_the_whole_sequence():
    old = torch.zeros(1, 2)
    logprobs = torch.tensor([[math.log(4.0), 0.0]], requires_grad=True)   # s = 2
    effective = algorithms.sequence_level_logprobs(logprobs, old, torch.ones(1, 2))
    terms = algorithms.ppo_clip_loss(effective, old, torch.ones(1, 2), eps_clip=0.2)
    assert close(terms.loss, [[-1.2, -1.2]], tol=1e-5) and close(terms.clipped, [[1.0, 1.0]])
    terms.loss.sum().backward()
    assert close(logprobs.grad, [[0.0, 0.0]])


def test_cispo_weights_the_log_prob_gradient_by_the_clipped_ratio():
    # ratios 1.5, 0.5, 1.0 (old = 0), eps 0.2: weights 1.2, 0.8, 1.0; advantages 1, 1, -1
    logprobs, old = ratios_to_logprobs([[1.5, 0.5, 1.0]])
    terms = algorithms.cispo_loss(logprobs, old, torch.tensor([[1.0, 1.0, -1.0]]), eps_clip=0.2)
    assert close(terms.loss, [[-1.2 * math.log(1.5), -0.8 * math.log(0.5), 0.0]], tol=1e-6)
    assert close(terms.clipped, [[1.0, 1.0, 0.0]])
    terms.loss.sum().backward()
    assert close(logprobs.grad, [[-1.2, -0.8, 1.0]], tol=1e-6)   # -w * A: clipped tokens keep a gradient


# ------------------------------------------------------------------------------------------------
# rollout correction (TIS, IcePop)
# ------------------------------------------------------------------------------------------------


def test_truncated_importance_weights_are_clamped_into_the_band():
    # old - rollout = ln 3, ln 1/4, 0: ratios 3, 0.25, 1 in the band [0.5, 2]
    rollout = torch.zeros(1, 3)
    old = torch.log(torch.tensor([[3.0, 0.25, 1.0]]))
    correction = algorithms.rollout_correction(old, rollout, low=0.5, high=2.0, mode="truncate")
    assert close(correction.weights, [[2.0, 0.5, 1.0]], tol=1e-6)
    assert close(correction.outside, [[1.0, 1.0, 0.0]])
    assert close(correction.ratio, [[3.0, 0.25, 1.0]], tol=1e-6)


def test_icepop_drops_tokens_outside_the_band_and_keeps_the_ratio_inside():
    rollout = torch.zeros(1, 3)
    old = torch.log(torch.tensor([[3.0, 0.25, 1.5]]))
    correction = algorithms.rollout_correction(old, rollout, low=0.5, high=2.0, mode="mask")
    assert close(correction.weights, [[0.0, 0.0, 1.5]], tol=1e-6)
    assert close(correction.outside, [[1.0, 1.0, 0.0]])


def test_rollout_correction_band_must_be_ordered():
    with pytest.raises(ValueError, match="--tis-clip"):
        algorithms.rollout_correction(torch.zeros(1), torch.zeros(1), low=2.0, high=1.0)


# ------------------------------------------------------------------------------------------------
# critic
# ------------------------------------------------------------------------------------------------


def test_clipped_value_loss_closed_form():
    # old values 0, clip 0.2:
    #   V=0.5, R=1:  (0.5-1)^2 = 0.25 < (0.2-1)^2 = 0.64  -> 0.32, clipped (no gradient)
    #   V=-0.1, R=1: inside the clip, (-1.1)^2 = 1.21      -> 0.605, gradient V - R = -1.1
    #   V=0.3, R=-1: (1.3)^2 = 1.69 > (0.2+1)^2 = 1.44     -> 0.845, gradient 1.3
    values = torch.tensor([[0.5, -0.1, 0.3]], requires_grad=True)
    terms = algorithms.clipped_value_loss(values, torch.zeros(1, 3), torch.tensor([[1.0, 1.0, -1.0]]), value_clip=0.2)
    assert close(terms.loss, [[0.32, 0.605, 0.845]], tol=1e-6)
    assert close(terms.clipped, [[1.0, 0.0, 0.0]])
    terms.loss.sum().backward()
    assert close(values.grad, [[0.0, -1.1, 1.3]], tol=1e-6)


def test_unclipped_value_loss_is_half_the_squared_error():
    terms = algorithms.clipped_value_loss(torch.tensor([2.0]), torch.tensor([0.0]), torch.tensor([-1.0]),
                                          value_clip=None)
    assert close(terms.loss, [4.5])


def test_explained_variance():
    returns, mask = torch.tensor([[1.0, 2.0, 3.0, 4.0, 99.0]]), torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    assert algorithms.explained_variance(returns, returns, mask) == pytest.approx(1.0)
    assert algorithms.explained_variance(torch.full((1, 5), 2.5), returns, mask) == pytest.approx(0.0)
    # residuals -1, 1, -1, 1: variance 1 against Var[R] = 1.25
    values = torch.tensor([[2.0, 1.0, 4.0, 3.0, 0.0]])
    assert algorithms.explained_variance(values, returns, mask) == pytest.approx(0.2)
    assert algorithms.explained_variance(values, torch.ones(1, 5), mask) == 0.0


def test_rollout_logprob_abs_diff_is_a_masked_token_mean_over_samples_with_engine_logprobs():
    from plasmid.types import Sample
    from plasmid_torch.training import rollout_logprob_abs_diff

    samples = [Sample(tokens=[1, 2, 3], response_length=2, rollout_logprobs=[-1.0, -2.0]),
               Sample(tokens=[1, 2, 3], response_length=2, rollout_logprobs=None),
               Sample(tokens=[1, 2, 3, 4], response_length=3, rollout_logprobs=[-1.0, -1.0, -1.0])]
    trainer = torch.tensor([[-1.5, -2.0, 0.0], [-9.0, -9.0, 0.0], [-1.0, -0.5, -3.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    # trained tokens of samples 0 and 2: |0.5|, 0, 0, |0.5| (sample 2's third token is masked)
    assert rollout_logprob_abs_diff(samples, trainer, mask) == pytest.approx(1.0 / 4)
    assert rollout_logprob_abs_diff(samples[1:2], trainer[1:2], mask[1:2]) is None


def test_check_samples_names_the_sample_that_cannot_be_trained():
    from plasmid.types import Sample
    from plasmid_torch.training import check_samples

    check_samples([Sample(tokens=[1, 2], response_length=1, loss_mask=[1])])
    with pytest.raises(ValueError, match="sample 1 .*loss_mask has 2 entries for 1 response tokens"):
        check_samples([Sample(tokens=[1, 2], response_length=1), Sample(tokens=[1, 2], response_length=1,
                                                                       loss_mask=[1, 1])])
    with pytest.raises(ValueError, match="no prompt token"):
        check_samples([Sample(tokens=[1], response_length=1)])


def test_index_chunks_and_step_metrics_over_updates():
    from plasmid_torch.training import index_chunks, update_metrics

    assert index_chunks(5, None) == [[0, 1, 2, 3, 4]]
    assert index_chunks(5, 2) == [[0, 1], [2, 3], [4]]
    per_update = [{"loss": 1.0, "lr": 0.1, "skipped_updates": 1.0},
                  {"loss": 3.0, "lr": 0.2, "skipped_updates": 0.0, "value_loss": 5.0}]
    assert update_metrics(per_update) == {"train/loss": 2.0, "train/lr": 0.2, "train/skipped_updates": 1.0,
                                          "train/value_loss": 5.0}
    assert update_metrics([]) == {}


def test_trainer_setup_needs_a_model_and_a_critic_loss_that_trains_the_critic():
    from types import SimpleNamespace

    from plasmid.errors import UsageError
    from plasmid_torch.training import check_trainer_setup

    class CriticWithoutValueLoss:
        needs_critic = True

    with pytest.raises(UsageError, match="mytrainer: --model is not set"):
        check_trainer_setup("mytrainer", SimpleNamespace(model=None), object())
    with pytest.raises(UsageError, match="mytrainer: the loss CriticWithoutValueLoss needs a critic"):
        check_trainer_setup("mytrainer", SimpleNamespace(model="m"), CriticWithoutValueLoss())
    check_trainer_setup("mytrainer", SimpleNamespace(model="m"), object())
