"""The ``agent`` reward keeps the reward contract, on samples that ``--generate agent`` made."""

from __future__ import annotations

import plasmid_agent.plugin
import pytest

from plasmid.testing import RewardContract, build, run
from plasmid.testing.contracts.reward import check_reward_value, make_sample


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
    assert run(reward(agent_sample("a", {"x": 1.0, "y": 0.5}))) == {"x": 1.0, "y": 0.5}
    with pytest.raises(ValueError, match="sample 4 carries no agent reward"):
        run(reward(make_sample("a", None, index=4)))
