"""GRPO's advantages, loss and metrics on a 4-sample batch, against values worked out by hand.

The batch: two groups of two, rewards [1, 0 | 0, 0], response mask (T = 3)::

    sample 0: 1 1 0    ratio 1.5 1.0        advantage +a
    sample 1: 1 1 1    ratio 0.5 1.0 1.0    advantage -a
    sample 2: 1 0 0                         advantage 0 (constant group)
    sample 3: 1 1 0                         advantage 0

with a = 0.5 / (std + eps), std = sqrt(0.5) (unbiased, of [1, 0]); 8 trained tokens. With
eps_clip 0.2 the per-token losses of samples 0 and 1 are [-1.2a, -a] (the first clipped) and
[0.8a, a, a] (the first clipped).
"""

from __future__ import annotations

import math

import plasmid_grpo.plugin
import pytest
import torch
from plasmid_grpo.loss import GRPOLoss

from plasmid import testing
from plasmid.types import LossBatch
from plasmid_torch.algorithms import GROUP_STD_EPS

A = 0.5 / (math.sqrt(0.5) + GROUP_STD_EPS)
LN2 = math.log(2.0)
MASK = [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]]
RATIOS = [[1.5, 1.0, 1.0], [0.5, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]


def make_loss(**options) -> GRPOLoss:
    config = testing.make_config(plasmid_grpo.plugin, **options)
    return testing.build("loss", "grpo", plasmid_grpo.plugin, config=config)


def make_batch(loss: GRPOLoss, **fields) -> LossBatch:
    batch = LossBatch(rewards=torch.tensor([1.0, 0.0, 0.0, 0.0]), group_index=torch.tensor([0, 0, 1, 1]),
                      response_mask=torch.tensor(MASK), old_logprobs=torch.full((4, 3), math.log(0.5)),
                      total_tokens=8, total_samples=4, **fields)
    batch.advantages, batch.returns = loss.advantages(batch)
    return batch


def current_logprobs(batch: LossBatch, ratios=RATIOS) -> torch.Tensor:
    return (batch.old_logprobs + torch.log(torch.tensor(ratios))).requires_grad_(True)


def test_advantages_are_group_normalised_rewards_on_trained_tokens():
    loss = make_loss()
    batch = make_batch(loss)
    expected = torch.tensor([[A, A, 0], [-A, -A, -A], [0, 0, 0], [0, 0, 0]])
    assert torch.allclose(batch.advantages, expected, atol=1e-6)
    assert batch.returns is None


def test_token_mean_loss_clip_fraction_and_approx_kl():
    loss = make_loss(eps_clip=0.2, loss_agg="token-mean")
    batch = make_batch(loss)
    logprobs = current_logprobs(batch)
    value, metrics = loss.policy_loss(batch, logprobs, None)
    assert math.isclose(value.item(), (-1.2 * A - A + 0.8 * A + A + A) / 8, rel_tol=1e-5)
    assert math.isclose(metrics["pg_loss"], value.item(), rel_tol=1e-6)
    assert metrics["clip_frac"] == pytest.approx(2 / 8)
    # approx_kl = k3(old || new) = r - 1 - ln r, token mean: r = 1.5 and r = 0.5 contribute
    assert metrics["approx_kl"] == pytest.approx(((0.5 - math.log(1.5)) + (-0.5 + LN2)) / 8, rel=1e-5)
    assert "kl" not in metrics and "entropy" not in metrics
    # the gradient is -A r / 8 on unclipped tokens and 0 on clipped ones
    value.backward()
    expected_grad = torch.tensor([[0, -A, 0], [0, A, A], [0, 0, 0], [0, 0, 0]]) / 8
    assert torch.allclose(logprobs.grad, expected_grad, atol=1e-6)


def test_seq_mean_token_mean_weighs_samples_equally():
    loss = make_loss(loss_agg="seq-mean-token-mean")
    batch = make_batch(loss)
    value, _ = loss.policy_loss(batch, current_logprobs(batch), None)
    assert math.isclose(value.item(), ((-1.2 * A - A) / 2 + (0.8 * A + A + A) / 3) / 4, rel_tol=1e-5)


def test_seq_mean_token_sum_norm_divides_by_max_new_tokens():
    loss = make_loss(loss_agg="seq-mean-token-sum-norm", max_new_tokens=4)
    batch = make_batch(loss)
    value, _ = loss.policy_loss(batch, current_logprobs(batch), None)
    assert math.isclose(value.item(), ((-1.2 * A - A) / 4 + (0.8 * A + A + A) / 4) / 4, rel_tol=1e-5)


def test_kl_loss_and_entropy_terms_are_added_with_their_coefficients():
    loss = make_loss(kl_loss_coef=0.1, kl_estimator="k3", entropy_coef=0.01)
    assert loss.needs_ref
    # the reference gives every token half the policy's probability: d = ln 2, k3 = 1/2 - 1 + ln 2
    batch = make_batch(loss, ref_logprobs=torch.full((4, 3), math.log(0.25)))
    logprobs = batch.old_logprobs.clone().requires_grad_(True)        # ratio 1: first update
    entropy = torch.full((4, 3), 2.0)
    value, metrics = loss.policy_loss(batch, logprobs, entropy)
    k3 = 0.5 - 1 + LN2
    pg = (-2 * A + 3 * A) / 8
    assert math.isclose(value.item(), pg + 0.1 * k3 - 0.01 * 2.0, rel_tol=1e-5)
    assert metrics["kl"] == pytest.approx(k3, rel=1e-5)
    assert metrics["kl_loss"] == pytest.approx(k3, rel=1e-5)
    assert metrics["entropy"] == pytest.approx(2.0)
    assert metrics["clip_frac"] == 0.0 and metrics["approx_kl"] == pytest.approx(0.0, abs=1e-7)


def test_kl_penalty_is_subtracted_from_rewards_before_normalising():
    loss = make_loss(kl_coef=0.5, kl_estimator="k1")
    assert loss.needs_ref
    old = torch.zeros(3, 2)
    ref = old - torch.tensor([[1.0, 1.0], [0.5, 0.0], [0.0, 0.0]])     # summed k1: 2, 0.5, 0
    batch = LossBatch(rewards=torch.tensor([1.0, 0.0, 0.0]), group_index=torch.zeros(3, dtype=torch.long),
                      response_mask=torch.ones(3, 2), old_logprobs=old, ref_logprobs=ref,
                      total_tokens=6, total_samples=3)
    advantages, _ = loss.advantages(batch)
    # penalised rewards [1 - 1, 0 - 0.25, 0] = [0, -1/4, 0]: mean -1/12, unbiased std sqrt(1/48)
    std = math.sqrt(1 / 48) + GROUP_STD_EPS
    expected = torch.tensor([1 / 12, -1 / 6, 1 / 12]) / std
    assert torch.allclose(advantages, expected.unsqueeze(-1).expand(3, 2), atol=1e-5)


def test_reference_is_needed_only_for_a_kl_term():
    assert not make_loss().needs_ref
    assert make_loss(kl_coef=0.01).needs_ref
    assert make_loss(kl_loss_coef=0.01).needs_ref


def test_missing_reference_logprobs_is_an_error_naming_the_flag():
    loss = make_loss(kl_loss_coef=0.1)
    batch = make_batch(loss)
    with pytest.raises(ValueError, match="--kl-loss-coef"):
        loss.policy_loss(batch, current_logprobs(batch), None)


def test_a_variant_is_a_small_subclass():
    class CenteredOnly(GRPOLoss):
        scale_rewards_by_std = False

    loss = CenteredOnly(testing.make_config(plasmid_grpo.plugin))
    batch = make_batch(loss)
    expected = torch.tensor([[0.5, 0.5, 0], [-0.5, -0.5, -0.5], [0, 0, 0], [0, 0, 0]])
    assert torch.allclose(batch.advantages, expected)
