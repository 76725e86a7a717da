"""``plasmid.providers``: a plugin builds a sibling provider of the run from the run's plugin lock
(or a registry it is given), with the kernel's errors."""

from __future__ import annotations

import pytest

import plasmid
from plasmid import hookimpl, providers
from plasmid.errors import PluginError, ProviderError
from plasmid.testing import make_config, make_registry


class Made:
    def __init__(self, config, *args):
        self.config, self.args = config, args


def broken(config):
    raise RuntimeError("no GPU")


class Plugin:
    @hookimpl
    def plasmid_losses(self, register):
        register("made", Made)
        register("broken", broken)


def test_build_calls_the_factory_with_the_config_and_the_extra_arguments():
    config, registry = make_config(Plugin()), make_registry(Plugin())
    made = providers.build("loss", "made", config, "a", 2, registry=registry)
    assert isinstance(made, Made) and made.config is config and made.args == ("a", 2)


def test_find_names_the_flag_that_chose_the_provider_and_builds_nothing():
    registry = make_registry(Plugin())
    assert providers.find("loss", "made", make_config(Plugin()), registry=registry).factory is Made
    with pytest.raises(PluginError, match=r"unknown loss 'mad' \(--sft-mix-loss\); did you mean 'made'"):
        providers.find("loss", "mad", make_config(Plugin()), registry=registry, flag="--sft-mix-loss")


def test_a_failing_factory_is_a_provider_error_naming_the_provider():
    with pytest.raises(ProviderError, match="loss 'broken' from plugin .* failed to start: RuntimeError: no GPU"):
        providers.build("loss", "broken", make_config(Plugin()), registry=make_registry(Plugin()))


def test_without_a_registry_the_run_s_plugin_lock_is_loaded():
    config = make_config()
    config.plugin_lock = [{"name": "plasmid", "distribution": "plasmid", "version": plasmid.__version__}]
    assert "single-turn" in providers.lock_registry(config).names("generate")
    assert providers.find("runtime", "local", config).plugin.name
    config.plugin_lock = [{"name": "plasmid", "distribution": "plasmid", "version": "0.0.0"}]
    with pytest.raises(PluginError, match="the driver runs plasmid 0.0.0"):
        providers.build("runtime", "local", config)
