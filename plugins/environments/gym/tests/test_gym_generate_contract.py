"""``--generate gym`` keeps the generate-function contract, on episodes of the real TextArena game:
the contract's prompts are replaced by the gym source's (an episode's first observation, rendered by
the tiny model's chat template, with the episode seed as label), and the tokenizer is that model's."""

import dataclasses

import pytest
from plasmid_gym import plugin

from plasmid.testing import build, make_config
from plasmid.testing.contracts.generate import GenerateContract

ENV = "textarena:GuessTheNumber-v0-train"


class TestGymGenerate(GenerateContract):
    plugin = plugin
    provider = "gym"
    config_options = {"gym_env": ENV, "gym_size": 8, "gym_eval_size": 1}

    @pytest.fixture(autouse=True)
    def _source(self, tiny_model, tmp_path):
        type(self).config_options = {**type(self).config_options, "model": tiny_model}
        config = make_config(plugin, run_dir=tmp_path, **type(self).config_options)
        self.source = build("datasource", "gym", plugin, config=config)

    def tokenizer(self):
        return self.source.tokenizer

    def prompt(self, text, index=0):
        """The source's next episode prompt (``text`` is the contract's and is not used)."""
        sample = self.source.get_groups(1)[0].samples[0]
        return dataclasses.replace(sample, index=index, group_index=index)
