"""From a command line to a configured run: load plugins, parse options, resolve providers.

Order matters and is fixed: ``--plugins`` is read first (plugins can add options, so the full
command line is parsed only after they load), then options, then provider choices (written back
into ``config.option`` so that ``plasmid_configure`` implementations see what was chosen), then
the configure hooks.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from plasmid.config import Config, OptionParser
from plasmid.errors import PluginError
from plasmid.options import default_run_dir
from plasmid.plugins import PluginManager, Selection, installed_entry_points
from plasmid.registry import Registry

#: one-provider families and the option naming each (the flag is ``--<option with dashes>``).
SINGLE_FAMILIES = {
    "datasource": "datasource",
    "engine": "engine",
    "generate": "generate",
    "rollout": "rollout",
    "trainer": "trainer",
    "weight_sync": "weight_sync",
    "loss": "loss",
    "runtime": "runtime",
}


@dataclass
class Startup:
    """A loaded and configured run, before any provider is built."""

    config: Config
    manager: PluginManager
    registry: Registry


def preparse(argv: list[str]) -> argparse.Namespace:
    """The options needed before plugins load: ``--plugins`` and ``--debug``."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--plugins", default=None)
    parser.add_argument("--debug", action="store_true")
    known, _ = parser.parse_known_args(argv)
    return known


def load_plugins(plugins_flag: str | None, environ: dict[str, str] | None = None) -> PluginManager:
    """A plugin manager with the plugins that ``--plugins`` / ``PLASMID_PLUGINS`` select."""
    environ = dict(os.environ) if environ is None else environ
    selection = Selection.from_env_or_flag(plugins_flag, installed_entry_points(), environ)
    manager = PluginManager()
    manager.load(selection)
    return manager


def start(argv: list[str], prog: str = "plasmid train", *,
          description: str = "Run RL post-training through the loaded plugins.",
          add_options: Callable[[OptionParser], None] | None = None, rewards_only: bool = False) -> Startup:
    """Load plugins, parse ``argv``, resolve every provider choice and run the configure hooks.

    For commands other than ``train`` (``plasmid score``): ``add_options`` adds the command's
    own options to the parser; ``rewards_only`` resolves only the rewards, leaving every other
    family unset, so that configure hooks preparing a training run (a data source's recipe
    building a model) do nothing.
    """
    early = preparse(argv)
    manager = load_plugins(early.plugins)
    registry = Registry.collect(manager)
    parser = OptionParser(prog=prog, description=description)
    manager.addoption(parser)
    if add_options is not None:
        add_options(parser)
    option = parser.parse(argv)
    run_dir = Path(option.run_dir) if option.run_dir else default_run_dir()
    config = Config(option=option, plugin_lock=manager.lock(), run_dir=run_dir)
    if rewards_only:
        resolve_rewards(config, registry)
    else:
        resolve_choices(config, registry)
    manager.configure(config)
    return Startup(config, manager, registry)


def resolve_choices(config: Config, registry: Registry, *, strict: bool = True) -> None:
    """Write the chosen provider name of every family into ``config.option`` (errors name the
    candidates); rewards default to the single or default reward when ``--reward`` is unset.

    ``strict=False`` (tests building partial setups) leaves a family unset when it cannot be
    resolved instead of raising.
    """
    option = config.option

    def choose(family: str, name: str | None) -> str | None:
        try:
            return registry.choose(family, name).name
        except PluginError:
            if strict:
                raise
            return name

    for family, attr in SINGLE_FAMILIES.items():
        setattr(option, attr, choose(family, getattr(option, attr)))
    resolve_rewards(config, registry, strict=strict)
    for name in option.filter:
        registry.get("filter", name)


def resolve_rewards(config: Config, registry: Registry, *, strict: bool = True) -> None:
    """Default ``--reward`` to the single or default reward when unset, and check every named
    reward exists (errors name the candidates)."""
    option = config.option
    if not option.reward:
        try:
            option.reward = [registry.choose("reward", None).name]
        except PluginError:
            if strict:
                raise
            option.reward = []
    for text in option.reward:
        registry.get("reward", text.partition(":")[0])
