"""The verifiers source and reward keep their families' contracts, on the real package."""

from plasmid_verifiers import plugin, vf

from plasmid.testing import DataSourceContract, RewardContract


class TestSingleTurnEnvironmentWithTheTinyModelRecipe(DataSourceContract):
    """As ``plasmid train --datasource verifiers`` runs it: the recipe builds the tiny model."""

    plugin = plugin
    provider = "verifiers"
    config_options = {"datasource": "verifiers", "vf_env": "vf_plasmid_sum"}


class TestToolEnvironmentShuffled(DataSourceContract):
    plugin = plugin
    provider = "verifiers"
    config_options = {"datasource": "verifiers", "vf_env": "vf_plasmid_tool", "vf_env_args": '{"size": 5}',
                      "vf_seed": 3}


def _cases() -> list[tuple[str, dict]]:
    rows = vf.dataset_rows(vf.load_env("vf_plasmid_sum"), "train")[:3]
    labels = [{"env": "vf_plasmid_sum", "env_args": {}, "row": row} for row in rows]
    return [case for label in labels for case in
            ((label["row"]["answer"], label), (label["row"]["answer"] + "1", label), ("", label))]


class TestReward(RewardContract):
    """Samples of another generate function: the response is scored as the one assistant message
    (the plugin's only data source is chosen in this config, so its recipe needs --vf-env)."""

    plugin = plugin
    provider = "verifiers"
    config_options = {"vf_env": "vf_plasmid_sum"}
    cases = _cases()
