"""``--turn-credit``: turn-level advantages from the per-turn rewards samples carry
(``metadata["turn_rewards"]``, :mod:`plasmid_torch.turns`).

The group: two 2-turn samples of one prompt, 6 response tokens each (turn 1 starts at offset 3;
token 2 is masked environment output)::

    sample A: turn rewards (+1, -1)   reward 0
    sample B: turn rewards (-1,  0)   reward -1

The scalar default pushes all of A's tokens up (0 > -1). With turn credit A's first turn (return
0 against B's -1) goes up and its second turn (return -1 against B's 0) goes down.
"""

from __future__ import annotations

import math

import plasmid_grpo.plugin
import pytest
import torch
from plasmid_grpo.loss import GRPOLoss

from plasmid import testing
from plasmid.errors import UsageError
from plasmid.types import LossBatch, Sample
from plasmid_torch import turns
from plasmid_torch.algorithms import GROUP_STD_EPS

MASK = [[1.0, 1.0, 0.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 1.0, 1.0, 1.0]]


def make_loss(loss: str = "grpo", **options) -> GRPOLoss:
    config = testing.make_config(plasmid_grpo.plugin, loss=loss, **options)
    return testing.build("loss", loss, plasmid_grpo.plugin, config=config)


def sample(index: int, reward: float, turn_rewards: list | None) -> Sample:
    metadata = {} if turn_rewards is None else {turns.TURN_REWARDS_KEY: turn_rewards}
    return Sample(prompt="p", tokens=[7] * 8, response_length=6, loss_mask=[int(m) for m in MASK[0]], index=index,
                  group_index=0, reward=reward, metadata=metadata)


def batch_of(samples: list[Sample], loss: GRPOLoss) -> LossBatch:
    batch = LossBatch(rewards=torch.tensor([s.reward for s in samples]),
                      group_index=torch.tensor([s.group_index for s in samples]),
                      response_mask=torch.tensor(MASK[:len(samples)]), old_logprobs=torch.zeros(len(samples), 6),
                      total_tokens=10, total_samples=len(samples))
    if loss.reads_turn_rewards:
        batch = turns.with_turns(batch, samples, 6)
    batch.advantages, batch.returns = loss.advantages(batch)
    return batch


def two_turn_group() -> list[Sample]:
    return [sample(0, 0.0, [[0, 1.0], [3, -1.0]]), sample(1, -1.0, [[0, -1.0], [3, 0.0]])]


def test_turn_credit_pushes_the_good_turn_up_and_the_bad_turn_down():
    scalar = batch_of(two_turn_group(), make_loss()).advantages
    by_turn = batch_of(two_turn_group(), make_loss(turn_credit="by-turn")).advantages
    a = 1.0 / (math.sqrt(2.0) + GROUP_STD_EPS)    # (x - mean) / std for a pair one apart
    assert scalar[0].tolist() == pytest.approx([a, a, 0.0, a, a, a])
    assert by_turn[0].tolist() == pytest.approx([a, a, 0.0, -a, -a, -a])
    assert by_turn[1].tolist() == pytest.approx([-a, -a, 0.0, a, a, a])
    # the policy gradient follows: A's second turn's log-probs are pushed down, not up
    loss = make_loss(turn_credit="by-turn")
    batch = batch_of(two_turn_group(), loss)
    logprobs = torch.zeros(2, 6, requires_grad=True)
    value, _ = loss.policy_loss(batch, logprobs, None)
    value.backward()
    assert (logprobs.grad[0, :2] < 0).all() and (logprobs.grad[0, 3:] > 0).all()
    assert logprobs.grad[0, 2] == 0


def test_pooled_compares_every_turn_of_the_group_and_discount_weighs_later_turns():
    # returns with discount 1: A (0, -1), B (-1, 0); pooled mean -0.5, std sqrt(1/3)
    pooled = batch_of(two_turn_group(), make_loss(turn_credit="pooled")).advantages
    unit = 0.5 / (math.sqrt(1 / 3) + GROUP_STD_EPS)
    assert pooled[0].tolist() == pytest.approx([unit, unit, 0.0, -unit, -unit, -unit])
    # discount 0: a turn's return is its own reward; A's turn 0 (+1) against B's (-1)
    myopic = batch_of(two_turn_group(), make_loss(turn_credit="by-turn", turn_discount=0.0)).advantages
    a = 1.0 / (math.sqrt(2.0) + GROUP_STD_EPS)
    assert myopic[0, 0] == pytest.approx(a) and myopic[0, 3] == pytest.approx(-a)


def test_samples_without_turn_rewards_are_one_turn_and_match_the_scalar_advantage():
    samples = [sample(0, 1.0, None), sample(1, 0.0, None)]
    for credit in ("by-turn", "pooled"):
        assert torch.equal(batch_of(samples, make_loss(turn_credit=credit)).advantages,
                           batch_of(samples, make_loss()).advantages)


def test_the_reward_beyond_the_turn_rewards_goes_to_the_last_turn():
    # B's reward is 1 more than its turns' sum (another reward function): its last turn gets it
    samples = [sample(0, 0.0, [[0, 1.0], [3, -1.0]]), sample(1, 0.0, [[0, -1.0], [3, 0.0]])]
    by_turn = batch_of(samples, make_loss(turn_credit="by-turn")).advantages
    # turn 0 returns: A 0, B 0 -> 0; turn 1 returns: A -1, B 1
    assert by_turn[0, 0] == 0 and by_turn[0, 3] < 0 < by_turn[1, 3]


def test_rloo_compares_turns_with_its_leave_one_out_baseline():
    by_turn = batch_of(two_turn_group(), make_loss("rloo", turn_credit="by-turn")).advantages
    assert by_turn[0].tolist() == pytest.approx([1.0, 1.0, 0.0, -1.0, -1.0, -1.0])


def test_a_micro_batch_slice_keeps_its_turns():
    loss = make_loss(turn_credit="by-turn")
    batch = batch_of(two_turn_group(), loss)
    part = batch.select(slice(1, 2))
    assert isinstance(part, turns.TurnLossBatch)
    assert part.turn_rewards.tolist() == [[-1.0, 0.0]] and part.turn_index[0].tolist() == [0, 0, 0, 1, 1, 1]


@pytest.mark.parametrize(("value", "message"), [
    ([], "non-empty list"),
    ([[0, 1.0], [0, 2.0]], "offsets must increase"),
    ([[6, 1.0]], "outside the response's 6 tokens"),
    ([[0, float("nan")]], "finite number"),
    ([[0.5, 1.0]], "token position"),
    ([1.0], "an \\[offset, reward\\] pair"),
])
def test_bad_turn_rewards_are_one_line_errors_naming_the_sample_and_key(value, message):
    samples = [sample(0, 0.0, value), sample(1, 0.0, None)]
    with pytest.raises(ValueError, match=message) as raised:
        batch_of(samples, make_loss(turn_credit="by-turn"))
    assert "sample 0: metadata['turn_rewards']" in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize(("options", "message"), [
    ({"turn_credit": "turns"}, "--turn-credit"),
    ({"turn_discount": 1.5}, "--turn-discount"),
])
def test_bad_turn_options_are_usage_errors(options, message):
    with pytest.raises(UsageError, match=message):
        testing.make_config(plasmid_grpo.plugin, **options)
