"""The plugin author's kit: its pytest fixtures and builders."""

from plasmid import hookimpl


class OneReward:
    @hookimpl
    def plasmid_rewards(self, register):
        register("one", lambda config: None)

    @hookimpl
    def plasmid_addoption(self, parser):
        parser.getgroup("one").addoption("--one-scale", type=float, default=2.0)


def test_plasmid_manager_fixture_has_only_the_kernel(plasmid_manager):
    assert {info.status for info in plasmid_manager.infos.values()} == {"kernel"}


def test_plasmid_config_fixture_adds_plugin_options_and_a_private_run_dir(plasmid_config, tmp_path):
    config = plasmid_config(OneReward(), one_scale=3.0)
    assert config.option.one_scale == 3.0 and config.option.reward == ["one"]
    assert str(config.run_dir).startswith(str(tmp_path))


def test_unknown_option_names_the_known_ones():
    import pytest

    from plasmid.testing import make_config

    with pytest.raises(AttributeError, match="no option 'learning_rate'"):
        make_config(learning_rate=1.0)
