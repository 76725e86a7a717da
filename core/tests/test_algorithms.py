"""plasmid.algorithms against closed forms worked out by hand on tiny tensors."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from plasmid import algorithms  # noqa: E402

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
