"""PPO's advantages (token rewards, GAE, whitening) and value loss, against values worked out by hand.

The batch: two samples, T = 3, gamma 0.9, lambda 0.5 (so gamma * lambda = 0.45)::

    sample 0: mask 1 1 0   reward 1   values 0.5 0.6 (9)
    sample 1: mask 1 0 1   reward 0   values 0.2 (9) 0.4    (a masked tool token in the middle)

Sample 0, reward on token 1:  delta_1 = 1 - 0.6 = 0.4, A_1 = 0.4
                              delta_0 = 0.9 * 0.6 - 0.5 = 0.04, A_0 = 0.04 + 0.45 * 0.4 = 0.22
Sample 1, reward 0 on token 2: delta_2 = -0.4, A_2 = -0.4; token 1 is skipped
                              delta_0 = 0.9 * 0.4 - 0.2 = 0.16, A_0 = 0.16 - 0.45 * 0.4 = -0.02
Returns = A + V: [0.72, 1.0 | 0.18, 0.4 - 0.4 = 0].
"""

from __future__ import annotations

import math
import statistics

import plasmid_ppo.plugin
import pytest
import torch

from plasmid import testing
from plasmid.types import LossBatch
from plasmid_torch.algorithms import WHITEN_EPS

MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
VALUES = torch.tensor([[0.5, 0.6, 9.0], [0.2, 9.0, 0.4]])


def make_loss(**options):
    config = testing.make_config(plasmid_ppo.plugin, gamma=0.9, lambd=0.5, **options)
    return testing.build("loss", "ppo", plasmid_ppo.plugin, config=config)


def make_batch(loss, **fields) -> LossBatch:
    batch = LossBatch(rewards=torch.tensor([1.0, 0.0]), group_index=torch.tensor([0, 1]), response_mask=MASK,
                      old_logprobs=torch.full((2, 3), -1.0), values=VALUES, total_tokens=4, total_samples=2, **fields)
    batch.advantages, batch.returns = loss.advantages(batch)
    return batch


def whitened(raw: list[float]) -> torch.Tensor:
    """The four trained tokens' advantages, whitened by hand, back in [2, 3] layout."""
    mean, std = statistics.mean(raw), statistics.stdev(raw)
    scaled = [(x - mean) / math.sqrt(std**2 + WHITEN_EPS) for x in raw]
    return torch.tensor([[scaled[0], scaled[1], 0.0], [scaled[2], 0.0, scaled[3]]])


def test_loss_needs_a_critic_and_no_reference_without_kl():
    loss = make_loss()
    assert loss.needs_critic and not loss.needs_ref
    assert make_loss(kl_coef=0.1).needs_ref


def test_gae_returns_and_whitened_advantages():
    batch = make_batch(make_loss())
    assert torch.allclose(batch.returns, torch.tensor([[0.72, 1.0, 0.0], [0.18, 0.0, 0.0]]), atol=1e-6)
    assert torch.allclose(batch.advantages, whitened([0.22, 0.4, -0.02, -0.4]), atol=1e-5)


def test_kl_penalty_is_subtracted_on_every_trained_token():
    # k1 with old - ref = 0.5, 1.0 | 2.0, 0.0 and kl_coef 0.1: token rewards [-0.05, 0.9 | -0.2, 0]
    #   sample 0: delta_1 = 0.9 - 0.6 = 0.3;  delta_0 = -0.05 + 0.54 - 0.5 = -0.01, A_0 = -0.01 + 0.45 * 0.3
    #   sample 1: A_2 = -0.4;                 delta_0 = -0.2 + 0.36 - 0.2 = -0.04, A_0 = -0.04 - 0.45 * 0.4
    loss = make_loss(kl_coef=0.1, kl_estimator="k1")
    ref = torch.full((2, 3), -1.0) - torch.tensor([[0.5, 1.0, 7.0], [2.0, 7.0, 0.0]])
    batch = make_batch(loss, ref_logprobs=ref)
    assert torch.allclose(batch.returns, torch.tensor([[0.625, 0.9, 0.0], [-0.02, 0.0, 0.0]]), atol=1e-6)
    assert torch.allclose(batch.advantages, whitened([0.125, 0.3, -0.22, -0.4]), atol=1e-5)


def test_with_gamma_and_lambda_one_the_advantage_is_return_minus_value():
    config = testing.make_config(plasmid_ppo.plugin, gamma=1.0, lambd=1.0)
    loss = testing.build("loss", "ppo", plasmid_ppo.plugin, config=config)
    batch = make_batch(loss)
    # sample 0: 1 - 0.5, 1 - 0.6;  sample 1: 0 - 0.2, 0 - 0.4
    assert torch.allclose(batch.advantages, whitened([0.5, 0.4, -0.2, -0.4]), atol=1e-5)
    assert torch.allclose(batch.returns, torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]), atol=1e-6)


def test_clipped_value_loss_and_metrics():
    loss = make_loss(value_clip=0.2)
    batch = make_batch(loss)
    values = (VALUES + torch.tensor([[0.3, 0.4, 5.0], [0.0, 5.0, 0.1]])).requires_grad_(True)
    value, metrics = loss.value_loss(batch, values)
    # token (V_old -> V, R): (0.5 -> 0.8, 0.72): (0.08)^2 > (0.7 - 0.72)^2, 0.5 * 0.0064 = 0.0032
    #                        (0.6 -> 1.0, 1.0):  clipped to 0.8, 0.5 * 0.2^2 = 0.02 (no gradient)
    #                        (0.2 -> 0.2, 0.18): 0.5 * 0.02^2 = 0.0002
    #                        (0.4 -> 0.5, 0):    inside the clip, 0.5 * 0.25 = 0.125
    assert value.item() == pytest.approx((0.0032 + 0.02 + 0.0002 + 0.125) / 4, rel=1e-4)
    assert metrics["value_loss"] == pytest.approx(value.item())
    assert metrics["value_clip_frac"] == pytest.approx(1 / 4)
    assert metrics["value_pred_mean"] == pytest.approx((0.8 + 1.0 + 0.2 + 0.5) / 4, rel=1e-6)
    value.backward()
    expected = torch.tensor([[0.08, 0.0, 0.0], [0.02, 0.0, 0.5]]) / 4     # (V - R) where unclipped
    assert torch.allclose(values.grad, expected, atol=1e-6)


def test_value_loss_without_clip_is_half_the_squared_error():
    loss = make_loss(value_clip=0.0)
    batch = make_batch(loss)
    values = (VALUES + torch.tensor([[0.3, 0.4, 5.0], [0.0, 5.0, 0.1]])).requires_grad_(True)
    value, metrics = loss.value_loss(batch, values)
    assert value.item() == pytest.approx((0.0032 + 0.0 + 0.0002 + 0.125) / 4, rel=1e-4)
    assert metrics["value_clip_frac"] == 0.0


def test_missing_values_is_an_error_that_names_the_trainer_duty():
    loss = make_loss()
    batch = LossBatch(rewards=torch.tensor([1.0]), group_index=torch.tensor([0]), response_mask=torch.ones(1, 2),
                      old_logprobs=torch.zeros(1, 2), total_tokens=2, total_samples=1)
    with pytest.raises(ValueError, match="needs_critic"):
        loss.advantages(batch)
