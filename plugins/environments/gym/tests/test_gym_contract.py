"""The gym source and reward keep their families' contracts, on the real TextArena package."""

import pytest
from plasmid_gym import plugin

from plasmid.testing import DataSourceContract, RewardContract, build, run
from plasmid.testing.contracts.reward import check_reward_value, make_sample


class TestGuessTheNumber(DataSourceContract):
    plugin = plugin
    provider = "gym"
    config_options = {"gym_env": "textarena:GuessTheNumber-v0-train", "gym_size": 20, "gym_eval_size": 3}

    @pytest.fixture(autouse=True)
    def _model(self, tiny_model):
        type(self).config_options = {**type(self).config_options, "model": tiny_model}


LABEL = {"env": "textarena:GuessTheNumber-v0-train", "seed": 1}


def gym_sample(response, value, index=0):
    sample = make_sample(response, LABEL, index=index)
    sample.metadata["gym_return"] = value
    return sample


class TestReward(RewardContract):
    """On samples that ``--generate gym`` made (they carry their episode return)."""

    plugin = plugin
    provider = "gym"

    @pytest.fixture
    def samples(self):
        return [gym_sample("[3]", 1.0, 0), gym_sample("[9]", 0.0, 1), gym_sample("", 0.25, 2)]

    def test_empty_response_scores_a_finite_value(self, reward_fn, samples):
        """The value is the episode's, stored on the sample: an empty response keeps it."""
        for sample in samples:
            check_reward_value(run(reward_fn(gym_sample("", sample.metadata["gym_return"]))), "gym")


def test_a_sample_without_an_episode_return_is_refused():
    with pytest.raises(ValueError, match="sample 4 carries no episode return"):
        run(build("reward", "gym", plugin)(make_sample("a", LABEL, index=4)))
