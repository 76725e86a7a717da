"""The plugin author's kit: build a configuration and registry in code, and contract suites.

A plugin's tests subclass its family's contract, naming only the provider::

    from plasmid.testing import RewardContract

    class TestMyReward(RewardContract):
        plugin = my_package.plugin      # the module with the hookimpls
        provider = "my-reward"          # the registered name

Contracts are re-exported here lazily; where each lives is the family table's
(:data:`plasmid.families.FAMILIES`): :mod:`plasmid.testing.contracts` for the families that need
no torch, :mod:`plasmid_torch.testing.contracts` (the plasmid-torch library) for the others. So is
``build_tiny_model`` (:func:`plasmid_torch.tiny.build_tiny_model`: a tiny model directory saved
from a config, for engine, trainer and end-to-end tests). A tool's rollouts without a model:
:mod:`plasmid.testing.toolcalls`.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from plasmid.config import Config, OptionParser
from plasmid.families import TESTING_EXTRAS, contract_index
from plasmid.plugins import PluginInfo, PluginManager
from plasmid.providers import adopt_legacy_score
from plasmid.registry import Registry
from plasmid.startup import finish_configuration, resolve_choices

#: Contract suite name -> ``"module:Class"``, from the family table (the suites of families
#: that need torch live in the plasmid-torch library), and the other lazy re-exports.
_CONTRACTS = {**contract_index(), **TESTING_EXTRAS}

T = TypeVar("T")


def __getattr__(name: str) -> Any:
    if name in _CONTRACTS:
        target = _CONTRACTS[name].partition(":")[0]
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError as exc:
            library = target.split(".")[0]
            if library != "plasmid" and exc.name is not None and exc.name.split(".")[0] == library:
                raise ImportError(f"{name} needs the {library.replace('_', '-')} library: "
                                  f"pip install {library.replace('_', '-')}", name=library) from exc
            raise
        return getattr(module, name)
    raise AttributeError(name)


def make_manager(*plugins: Any) -> PluginManager:
    """A plugin manager with the kernel's plugins and exactly ``plugins`` (modules or objects
    with hookimpls), nothing auto-loaded from entry points."""
    manager = PluginManager()
    manager.load_kernel_plugins()
    for plugin in plugins:
        name = getattr(plugin, "__name__", type(plugin).__name__)
        manager._register(plugin, PluginInfo(name, "(test)", "", name))
    manager.check()
    return manager


def make_config(*plugins: Any, run_dir: str | Path | None = None, configure: bool = True, **options: Any) -> Config:
    """A :class:`Config` with every option of the kernel and ``plugins`` at its default,
    overridden by ``options`` (Python names: ``temperature=0.5``; these count as given by the user).
    Unless ``configure=False``, provider choices are resolved as ``plasmid train`` does (families
    that cannot be resolved from ``plugins`` stay unset), the defaults hooks run, every declared
    options class is checked and the configure hooks run. For tests and notebooks."""
    manager = make_manager(*plugins)
    parser = OptionParser()
    manager.addoption(parser)
    namespace = parser.defaults()
    for key, value in options.items():
        if not hasattr(namespace, key):
            raise AttributeError(f"no option {key!r}; options are: {sorted(vars(namespace))}")
        setattr(namespace, key, value)
    config = Config(option=namespace, plugin_lock=manager.lock(), run_dir=Path(run_dir or "runs/test"),
                    given=frozenset(options))
    if configure:
        resolve_choices(config, Registry.collect(manager), strict=False)
        finish_configuration(config, manager, parser.option_classes)
    return config


def make_registry(*plugins: Any) -> Registry:
    """The registry that ``plugins`` (plus the kernel's own) register."""
    return Registry.collect(make_manager(*plugins))


def build(family: str, name: str, *plugins: Any, config: Config | None = None, args: tuple[Any, ...] = ()) -> Any:
    """Build provider ``name`` of ``family`` from ``plugins``: ``factory(config, *args)`` (an
    engine with only the deprecated ``score`` gets its new name, as in a run:
    :func:`plasmid.providers.adopt_legacy_score`)."""
    registry = make_registry(*plugins)
    provider = registry.get(family, name)
    built = provider.load()(config or make_config(*plugins), *args)
    return adopt_legacy_score(built, f"engine {provider.describe()}") if family == "engine" else built


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion (contract tests are plain sync pytest tests)."""
    return asyncio.run(coroutine)


__all__ = ["build", "make_config", "make_manager", "make_registry", "run", *_CONTRACTS]
