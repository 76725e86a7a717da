"""The ``agent`` reward keeps the reward contract, on samples that ``--generate agent`` made."""

from __future__ import annotations

import plasmid_agent.plugin
import pytest

from plasmid.rewards import RewardComponent, RewardSet
from plasmid.testing import RewardContract, build, make_config, run
from plasmid.testing.contracts.reward import check_reward_value, make_sample
from plasmid.types import RewardParts


def agent_sample(response, reward, index=0):
    sample = make_sample(response, None, index=index)
    sample.metadata["agent_reward"] = reward
    return sample


class TestAgentRewardContract(RewardContract):
    plugin = plasmid_agent.plugin
    provider = "agent"

    @pytest.fixture
    def samples(self):
        return [agent_sample("6", 1.0, 0), agent_sample("x", 0.0, 1), agent_sample("", -0.5, 2)]

    def test_empty_response_scores_a_finite_value(self, reward_fn, samples):
        """The value is the agent's, stored on the sample: an empty response keeps it."""
        for sample in samples:
            check_reward_value(run(reward_fn(agent_sample("", sample.metadata["agent_reward"]))), "agent")


def test_the_agents_value_is_the_reward_and_a_sample_without_one_is_refused():
    reward = build("reward", "agent", plasmid_agent.plugin)
    assert run(reward(agent_sample("a", 2))) == 2.0
    assert run(reward(agent_sample("a", {"x": 1.0}))) == RewardParts(1.0, {"x": 1.0})
    with pytest.raises(ValueError, match="sample 4 carries no agent reward"):
        run(reward(make_sample("a", None, index=4)))


def test_every_key_of_a_dict_is_a_part_logged_as_a_metric_and_the_reward_key_picks_the_reward():
    """Each key the agent returned becomes ``rollout/reward/agent.<key>`` through the real reward set."""
    config = make_config(plasmid_agent.plugin, reward_key="score")
    reward = build("reward", "agent", plasmid_agent.plugin, config=config)
    value = run(reward(agent_sample("a", {"score": 1.0, "turns": 3, "format": 0.5})))
    assert value == RewardParts(1.0, {"score": 1.0, "turns": 3.0, "format": 0.5})
    rewards = RewardSet([RewardComponent("agent", 1.0, reward)])
    sample = agent_sample("a", {"score": 1.0, "turns": 3, "format": 0.5})
    run(rewards.score_group([sample]))
    assert sample.reward == 1.0
    assert sample.reward_components == {"agent": 1.0, "agent.score": 1.0, "agent.turns": 3.0, "agent.format": 0.5}


def test_a_dict_without_a_chosen_key_is_refused_naming_its_keys():
    several = build("reward", "agent", plasmid_agent.plugin)
    with pytest.raises(ValueError, match=r"sample 0: the agent returned the keys \['a', 'b'\]; choose .*--reward-key"):
        run(several(agent_sample("x", {"a": 1.0, "b": 0.0})))
    named = build("reward", "agent", plasmid_agent.plugin,
                  config=make_config(plasmid_agent.plugin, reward_key="c"))
    with pytest.raises(ValueError, match="no --reward-key 'c'"):
        run(named(agent_sample("x", {"a": 1.0, "b": 0.0})))
