"""The options of plasmid-verifiers: bad values are one-line UsageErrors naming the flag."""

import importlib.metadata

import pytest
from plasmid_verifiers import plugin, vf

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
