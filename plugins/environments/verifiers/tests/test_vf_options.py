"""The options of plasmid-verifiers: bad values are one-line UsageErrors naming the flag."""

import importlib.metadata
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from plasmid_verifiers import plugin, vf

from plasmid.app.cli import main
from plasmid.errors import UsageError
from plasmid.testing import make_config


@pytest.mark.parametrize("text, message", [("{", "not JSON"), ("[1]", "JSON object"), ("3", "JSON object")])
def test_vf_env_args_must_be_a_json_object(tmp_path, text, message):
    with pytest.raises(UsageError, match=message) as info:
        make_config(plugin, run_dir=tmp_path, vf_env_args=text)
    assert "--vf-env-args" in str(info.value) and "\n" not in str(info.value)


def test_datasource_verifiers_needs_vf_env(tmp_path):
    with pytest.raises(UsageError, match="needs --vf-env"):
        make_config(plugin, run_dir=tmp_path, datasource="verifiers")


def test_an_environment_that_is_not_installed_is_one_line_naming_vf_env(tmp_path):
    with pytest.raises(UsageError, match="--vf-env no_such_env_here: verifiers could not load it") as info:
        make_config(plugin, run_dir=tmp_path, datasource="verifiers", vf_env="no_such_env_here")
    assert "\n" not in str(info.value)


def test_load_environment_arguments_it_does_not_take_are_one_line(tmp_path):
    with pytest.raises(UsageError, match="--vf-env vf_plasmid_sum: verifiers could not load it"):
        make_config(plugin, run_dir=tmp_path, datasource="verifiers", vf_env="vf_plasmid_sum",
                    vf_env_args='{"no_such_argument": 1}')


@pytest.mark.parametrize(("distribution", "installed", "message"), [
    ("verifiers", "0.4.0", "plasmid: error: verifiers 0.4.0 is installed but plasmid-verifiers supports "
                           "verifiers<0.3.2,>=0.3.1; pip install 'verifiers<0.3.2,>=0.3.1'"),
    ("verifiers", None, "plasmid: error: plasmid-verifiers needs verifiers, which is not installed; "
                        "pip install 'verifiers<0.3.2,>=0.3.1'"),
    ("openai", "2.8.0", "plasmid: error: openai 2.8.0 is installed but plasmid-verifiers supports openai<4,>=3.57; "
                        "pip install 'openai<4,>=3.57'"),
])
def test_an_unsupported_verifiers_or_openai_stops_plasmid_train_at_start_up(tmp_path, capsys, monkeypatch,
                                                                           distribution, installed, message):
    real = importlib.metadata.version

    def version(name):  # what plasmid_torch.versions reads; every other distribution as installed
        if name != distribution:
            return real(name)
        if installed is None:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed

    monkeypatch.setattr(importlib.metadata, "version", version)
    run_dir = tmp_path / "run"
    code = main(["train", "--datasource", "verifiers", "--vf-env", "vf_plasmid_sum", "--run-dir", str(run_dir)])
    assert code == 2
    assert capsys.readouterr().err.strip() == message, "one line, with the pip command"
    assert not run_dir.exists(), "refused before the run directory is written"


def test_the_supported_ranges_are_the_pyprojects():
    declared = {Requirement(line).name: Requirement(line).specifier for line in tomllib.loads(
        (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]["dependencies"]}
    assert (declared["verifiers"], declared["openai"]) == (vf.SUPPORTED, vf.OPENAI_SUPPORTED)


def test_vf_seed_defaults_to_seed_and_its_help_says_so(tmp_path):
    from plasmid_verifiers.options import VerifiersOptions

    from plasmid.options import option_fields
    from plasmid.testing import build

    def order(**options):
        config = make_config(plugin, run_dir=tmp_path / "run", datasource="verifiers", vf_env="vf_plasmid_tool",
                             vf_env_args='{"size": 8}', **options)
        return build("datasource", "verifiers", plugin, config=config).epoch_order(0)

    assert order(seed=5) == order(seed=11, vf_seed=5) != order(seed=11)
    assert order(seed=5) != sorted(order(seed=5)), "unset, the dataset is shuffled with --seed, not kept in order"
    [field] = [field for field in option_fields(VerifiersOptions) if field.name == "vf_seed"]
    assert field.help_text().endswith("(default: --seed)") and "dataset's order" not in field.help_text()


def test_an_unsupported_verifiers_version_is_one_line_with_the_pip_command(monkeypatch):
    assert vf.check_version() == importlib.metadata.version("verifiers")
    monkeypatch.setattr(vf, "installed_version", lambda: "0.4.0")
    with pytest.raises(UsageError, match=r"verifiers 0.4.0 is installed but plasmid-verifiers supports .*pip install"):
        vf.check_version()
    monkeypatch.setattr(vf, "installed_version", lambda: None)
    with pytest.raises(UsageError, match="not installed"):
        vf.check_version()


def test_the_recipe_runs_the_environment_through_the_agent_gateway_with_its_rubric(tmp_path):
    config = make_config(plugin, run_dir=tmp_path, datasource="verifiers", vf_env="vf_plasmid_sum")
    assert config.option.generate == "agent" and config.option.agent == "plasmid_verifiers.rollout:run"
    assert config.option.reward_weights == [("verifiers", 1.0)]
    assert config.option.model == str(tmp_path / "model")
