"""REINFORCE++'s advantages against values worked out by hand.

The batch (T = 3), gamma 0.5 unless said otherwise::

    sample 0: mask 1 1 0   reward 1   group 0
    sample 1: mask 1 0 1   reward 0   group 0     (a masked tool token in the middle)
    sample 2: mask 1 1 1   reward 2   group 1
    sample 3: mask 1 0 0   reward 0   group 1

The reward sits on each sample's last trained token; returns are discounted back over trained
tokens only, then whitened across all 8 trained tokens of the batch.
"""

from __future__ import annotations

import math
import statistics

import plasmid_reinforce_pp.plugin
import pytest
import torch

from plasmid import testing
from plasmid.types import LossBatch
from plasmid_torch.algorithms import WHITEN_EPS

MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])


def make_loss(provider: str = "reinforce++", **options):
    options.setdefault("gamma", 0.5)
    config = testing.make_config(plasmid_reinforce_pp.plugin, **options)
    return testing.build("loss", provider, plasmid_reinforce_pp.plugin, config=config)


def advantages_of(loss, **fields) -> torch.Tensor:
    batch = LossBatch(rewards=torch.tensor([1.0, 0.0, 2.0, 0.0]), group_index=torch.tensor([0, 0, 1, 1]),
                      response_mask=MASK, old_logprobs=torch.full((4, 3), -1.0), total_tokens=8, total_samples=4,
                      **fields)
    advantages, returns = loss.advantages(batch)
    assert returns is None
    return advantages


def whitened(rows: list[list[float]]) -> torch.Tensor:
    """Per-sample returns of the trained tokens, whitened by hand and laid out as MASK."""
    flat = [x for row in rows for x in row]
    mean, std = statistics.mean(flat), statistics.stdev(flat)
    out = torch.zeros(4, 3)
    for row, values in enumerate(rows):
        positions = MASK[row].nonzero().flatten().tolist()
        for position, value in zip(positions, values, strict=True):
            out[row, position] = (value - mean) / math.sqrt(std**2 + WHITEN_EPS)
    return out


def test_both_providers_are_registered_and_need_no_critic():
    for provider in ("reinforce++", "reinforce++-baseline"):
        loss = make_loss(provider)
        assert not loss.needs_critic and not loss.needs_ref


def test_discounted_returns_whitened_across_the_batch():
    # returns: sample 0 [0.5 * 1, 1];  sample 1 [0, 0];  sample 2 [0.25 * 2, 0.5 * 2, 2];  sample 3 [0]
    expected = whitened([[0.5, 1.0], [0.0, 0.0], [0.5, 1.0, 2.0], [0.0]])
    assert torch.allclose(advantages_of(make_loss()), expected, atol=1e-5)


def test_baseline_variant_subtracts_the_group_mean_first():
    # group means 0.5 and 1: rewards become [0.5, -0.5 | 1, -1], then discounted with gamma 0.5
    expected = whitened([[0.25, 0.5], [-0.25, -0.5], [0.25, 0.5, 1.0], [-1.0]])
    assert torch.allclose(advantages_of(make_loss("reinforce++-baseline")), expected, atol=1e-5)


def test_kl_penalty_is_charged_on_every_trained_token():
    # k1 = 1 on every token, kl_coef 0.1, gamma 1: every trained token costs 0.1
    loss = make_loss(kl_coef=0.1, kl_estimator="k1", gamma=1.0)
    assert loss.needs_ref
    advantages = advantages_of(loss, ref_logprobs=torch.full((4, 3), -2.0))
    expected = whitened([[0.8, 0.9], [-0.2, -0.1], [1.7, 1.8, 1.9], [-0.1]])
    assert torch.allclose(advantages, expected, atol=1e-5)


def test_policy_loss_is_the_clipped_loss_on_these_advantages():
    loss = make_loss(eps_clip=0.2)
    batch = LossBatch(rewards=torch.tensor([1.0, 0.0]), group_index=torch.tensor([0, 0]),
                      response_mask=torch.ones(2, 1), old_logprobs=torch.zeros(2, 1), total_tokens=2, total_samples=2)
    batch.advantages, batch.returns = loss.advantages(batch)
    # returns 1 and 0 whitened: +-(0.5 / sqrt(0.5)) = +-sqrt(0.5); ratios 1.5 (clipped at 1.2) and 1
    a = 0.5 / math.sqrt(0.5 + WHITEN_EPS)
    logprobs = torch.log(torch.tensor([[1.5], [1.0]])).requires_grad_(True)
    value, metrics = loss.policy_loss(batch, logprobs, None)
    assert value.item() == pytest.approx((-1.2 * a + a) / 2, rel=1e-5)
    assert metrics["clip_frac"] == pytest.approx(0.5)
