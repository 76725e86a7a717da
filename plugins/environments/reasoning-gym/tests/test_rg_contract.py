"""The reasoning-gym source and reward keep their families' contracts, on the real package."""

from plasmid_reasoning_gym import plugin
from plasmid_reasoning_gym.mixture import Split, parse_mixture

from plasmid.testing import DataSourceContract, RewardContract


class TestOneDatasetWithTheTinyModelRecipe(DataSourceContract):
    """As ``plasmid train --datasource reasoning-gym`` runs it: the recipe builds the tiny model.
    20 training entries, so the resume test crosses epochs."""

    plugin = plugin
    provider = "reasoning-gym"
    config_options = {"rg_dataset": ("basic_arithmetic",), "rg_size": 20, "rg_eval_size": 5}


class TestAWeightedMixtureWithConfigs(DataSourceContract):
    plugin = plugin
    provider = "reasoning-gym"
    config_options = {"rg_dataset": ("chain_sum:3", "leg_counting"), "rg_config": ("chain_sum.max_terms=3",),
                      "rg_size": 30, "rg_eval_size": 4, "rg_seed": 11, "rg_system_prompt": "none"}


def _cases() -> list[tuple[str, dict]]:
    split = Split(parse_mixture(("chain_sum", "leg_counting"), ()), split="train", size=4, seed=3)
    cases = []
    for k in range(split.size):
        answer = split.entry(k)["answer"]
        cases += [(f"<answer>{answer}</answer>", split.label(k)), (f"<answer>{answer}1</answer>", split.label(k)),
                  (answer, split.label(k))]
    return cases


class TestReward(RewardContract):
    plugin = plugin
    provider = "reasoning-gym"
    cases = _cases()
