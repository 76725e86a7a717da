"""The options of plasmid-gym: bad values are one-line UsageErrors naming the flag."""

import pytest
from plasmid_gym import envs, plugin

from plasmid.errors import UsageError
from plasmid.testing import build, make_config


@pytest.mark.parametrize("spec", ["textarena", ":GuessTheNumber-v0", "textarena:"])
def test_gym_env_is_package_colon_env_id(tmp_path, spec):
    with pytest.raises(UsageError, match="--gym-env .*PACKAGE:ENV_ID"):
        make_config(plugin, run_dir=tmp_path, gym_env=spec)


@pytest.mark.parametrize("spec, message", [("no_such_package_here:X-v0", "no module 'no_such_package_here'"),
                                           ("json:X-v0", "json has no make"),
                                           ("textarena:NoSuchGame-v0", r"textarena.make\('NoSuchGame-v0'\) failed")])
def test_an_environment_that_cannot_be_made_is_one_line(spec, message):
    with pytest.raises(UsageError, match=message) as info:
        envs.make(spec)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("value", [-0.1, 1.5])
def test_gamma_is_between_0_and_1(tmp_path, value):
    with pytest.raises(UsageError, match="--gym-gamma"):
        make_config(plugin, run_dir=tmp_path, gym_gamma=value)


def test_the_generate_function_and_source_need_gym_env(tmp_path):
    config = make_config(plugin, run_dir=tmp_path)
    with pytest.raises(UsageError, match="--generate gym needs --gym-env"):
        build("generate", "gym", plugin, config=config)
    with pytest.raises(UsageError, match="--datasource gym needs --gym-env"):
        build("datasource", "gym", plugin, config=config)


def test_discounting_and_new_text():
    assert envs.discounted([0.0, 0.0, 1.0], 0.5) == 0.25 and envs.discounted([1.0, 2.0], 1.0) == 3.0
    assert envs.new_text("abc", "abcde") == "de" and envs.new_text("abc", "xyz") == "xyz"
