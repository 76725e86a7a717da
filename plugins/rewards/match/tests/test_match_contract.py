"""Each match reward keeps the reward contract."""

from __future__ import annotations

import asyncio

import plasmid_match.plugin
from plasmid_match.rewards import ChoiceReward, ExactMatch, NormalizedMatch, TokenF1

from plasmid.rewards import RewardComponent, RewardSet
from plasmid.testing import RewardContract
from plasmid.types import Sample

MATCH_CASES = [
    ("4", "4"),
    (" 4\n", "4"),
    ("5", "4"),
    ("The Eiffel Tower.", "eiffel tower"),
    ("x", ["y", "x"]),
    ("the cat sat", "cat"),
    ("7", 7),
]


class TestExactContract(RewardContract):
    plugin = plasmid_match.plugin
    provider = "exact"
    cases = MATCH_CASES


class TestNormalizedContract(RewardContract):
    plugin = plasmid_match.plugin
    provider = "normalized"
    cases = MATCH_CASES


class TestF1Contract(RewardContract):
    plugin = plasmid_match.plugin
    provider = "f1"
    cases = MATCH_CASES


def test_every_match_reward_is_inline_and_scored_on_the_callers_thread():
    """The match rewards declare ``inline = True``, so the kernel scores them without a worker thread."""
    for reward in (ExactMatch, NormalizedMatch, TokenF1, ChoiceReward):
        assert reward.inline is True, reward
    rewards = RewardSet(components=[RewardComponent("exact", 1.0, ExactMatch(None))])
    samples = [Sample(index=0, response=" 4\n", label="4"), Sample(index=1, response="5", label="4")]
    asyncio.run(rewards.score_group(samples))
    assert [s.reward for s in samples] == [1.0, 0.0]
    assert rewards._workers.current == {}
