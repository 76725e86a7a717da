"""The reasoning-gym options are declared once, and every bad value or config is one line naming
it (close matches listed), before anything is written."""

import importlib.metadata
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from plasmid_reasoning_gym import gym, plugin
from plasmid_reasoning_gym.options import ReasoningGymOptions
from plasmid_reasoning_gym.reward import ReasoningGymReward
from plasmid_reasoning_gym.source import ReasoningGymSource

from plasmid.errors import UsageError
from plasmid.kernel_options import GeneralOptions
from plasmid.testing import make_config


def test_the_typed_read_gives_the_declared_defaults():
    options = ReasoningGymOptions.of(make_config(plugin, datasource=None))
    assert options == ReasoningGymOptions.defaults()
    assert (options.rg_dataset, options.rg_size, options.rg_eval_size, options.rg_seed, options.rg_config,
            options.rg_system_prompt, options.rg_answer_format, options.rg_answer_tag) == (
        ("basic_arithmetic",), 10000, 100, None, (), "default", "tags", "answer")


@pytest.mark.parametrize(("bad", "message"), [
    ({"rg_dataset": ("basic_arithmetc",)},
     "--rg-dataset 'basic_arithmetc': reasoning-gym has no such dataset; did you mean basic_arithmetic, "
     "bitwise_arithmetic, decimal_arithmetic?"),
    ({"rg_dataset": ("chain_sum:x",)}, "--rg-dataset 'chain_sum:x': the weight after ':' must be a number"),
    ({"rg_dataset": ("chain_sum:0",)},
     "--rg-dataset 'chain_sum:0': the weight after ':' must be a positive finite number"),
    ({"rg_dataset": ("chain_sum:nan",)},
     "--rg-dataset 'chain_sum:nan': the weight after ':' must be a positive finite number"),
    ({"rg_dataset": ("chain_sum", "chain_sum:2")},
     "--rg-dataset 'chain_sum:2': chain_sum is given twice; give each dataset once with its weight"),
    ({"rg_config": ("chain_sum.max_terms",)},
     "--rg-config 'chain_sum.max_terms': expected NAME.KEY=VALUE (e.g. basic_arithmetic.max_terms=3)"),
    ({"rg_dataset": ("chain_sum",), "rg_config": ("chain_sun.max_terms=3",)},
     "--rg-config 'chain_sun.max_terms=3': chain_sun is not one of the --rg-dataset datasets (chain_sum); "
     "did you mean chain_sum?"),
    ({"rg_dataset": ("chain_sum",), "rg_config": ("chain_sum.max_term=3",)},
     "--rg-config 'chain_sum.max_term=3': chain_sum has no config field 'max_term'; did you mean max_terms, "
     "min_terms?"),
    ({"rg_dataset": ("chain_sum",), "rg_config": ("chain_sum.seed=3",)},
     "--rg-config 'chain_sum.seed=3': seed is set by --rg-seed, not --rg-config"),
    ({"rg_dataset": ("chain_sum",), "rg_config": ("chain_sum.min_terms=0",)},
     "--rg-config chain_sum.min_terms=0: reasoning-gym rejects the config of chain_sum: min_terms must be "
     "positive"),
    ({"rg_system_prompt": "defualt"},
     "--rg-system-prompt 'defualt': choose one of DeepSeekZero, chain_of_draft, default, direct, simple, none; "
     "did you mean default?"),
    ({"rg_answer_format": "xml"}, "--rg-answer-format 'xml': choose one of tags, last-line, none"),
    ({"rg_size": 0}, "--rg-size 0: must be >= 1"),
])
def test_a_bad_value_is_a_one_line_usage_error_naming_its_flag(tmp_path, bad, message):
    with pytest.raises(UsageError) as raised:
        make_config(plugin, run_dir=tmp_path / "run", datasource="reasoning-gym", **bad)
    assert str(raised.value) == message
    assert not (tmp_path / "run").exists()


def test_config_values_are_json_when_they_parse_and_reach_the_dataset():
    from plasmid_reasoning_gym.mixture import parse_mixture

    [component] = parse_mixture(("basic_arithmetic",), ("basic_arithmetic.max_terms=3",
                                                        "basic_arithmetic.format_style=natural"))
    assert component.config == {"max_terms": 3, "format_style": "natural"}
    assert gym.dataset("basic_arithmetic", {**component.config, "seed": 1, "size": 2}).config.max_terms == 3


@pytest.mark.parametrize(("installed", "message"), [
    (None, "plasmid-reasoning-gym needs reasoning-gym, which is not installed; "
           "pip install 'reasoning-gym<0.1.26,>=0.1.25'"),
    ("0.1.24", "reasoning-gym 0.1.24 is installed but plasmid-reasoning-gym supports reasoning-gym<0.1.26,>=0.1.25; "
               "pip install 'reasoning-gym<0.1.26,>=0.1.25'"),
    ("0.1.10", "reasoning-gym 0.1.10 is installed but plasmid-reasoning-gym supports reasoning-gym<0.1.26,>=0.1.25; "
               "pip install 'reasoning-gym<0.1.26,>=0.1.25'"),
    ("0.2.0", "reasoning-gym 0.2.0 is installed but plasmid-reasoning-gym supports reasoning-gym<0.1.26,>=0.1.25; "
              "pip install 'reasoning-gym<0.1.26,>=0.1.25'"),
])
@pytest.mark.parametrize("chosen", [{"datasource": "reasoning-gym"}, {"datasource": None, "reward": ["reasoning-gym"]}])
def test_an_unsupported_reasoning_gym_is_one_line_at_start_up(monkeypatch, tmp_path, installed, message, chosen):
    def version(name):
        if installed is None:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed

    monkeypatch.setattr(importlib.metadata, "version", version)  # what plasmid_torch.versions reads
    with pytest.raises(UsageError) as raised:
        make_config(plugin, run_dir=tmp_path / "run", **chosen)
    assert str(raised.value) == message


def test_the_installed_version_is_supported():
    assert gym.check_version() == importlib.metadata.version("reasoning-gym")


def test_the_supported_range_is_declared_alike_everywhere():
    """One bound: start-up's (``gym.SUPPORTED``) is the pyproject's requirement, the environments
    requirements file's and the README's."""
    plugin_dir = Path(__file__).resolve().parent.parent
    root = plugin_dir.parent.parent.parent
    declared = [Requirement(line) for line in
                tomllib.loads((plugin_dir / "pyproject.toml").read_text())["project"]["dependencies"]]
    assert [r.specifier for r in declared if r.name == "reasoning-gym"] == [gym.SUPPORTED]
    pinned = [Requirement(line.split("#")[0]) for line in (root / "requirements" / "environments.txt").read_text()
              .splitlines() if line.startswith("reasoning-gym")]
    assert [r.specifier for r in pinned] == [gym.SUPPORTED]
    bound = ",".join(sorted((str(spec) for spec in gym.SUPPORTED), key=lambda spec: not spec.startswith(">")))
    assert f"Supported reasoning-gym: `{bound}`" in (plugin_dir / "README.md").read_text()


def test_without_model_the_recipe_names_the_tiny_model_and_writes_nothing(tmp_path):
    config = make_config(plugin, run_dir=tmp_path / "run", datasource="reasoning-gym")
    general = GeneralOptions.of(config)
    assert general.model == str(tmp_path / "run" / "model")
    assert (config.option.lr, config.option.max_new_tokens) == (5e-4, 32)
    assert not (tmp_path / "run").exists()


def test_the_providers_list_the_options_they_read():
    assert ReasoningGymOptions in ReasoningGymSource.option_classes
    assert ReasoningGymOptions in ReasoningGymReward.option_classes
