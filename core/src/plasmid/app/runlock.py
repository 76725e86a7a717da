"""What a run used, recorded in its plugin lock, and what a resume compares.

The kernel's lock (:meth:`plasmid.plugins.PluginManager.lock`) lists every loaded plugin. The
application adds to each entry what the run took from that plugin (:func:`used_lock`):

- ``providers``: ``{family: [name, ...]}``, the chosen providers it registered (``--reward``,
  ``--loss``, ``--datasource``, ... as resolved at start-up);
- ``options``: the destinations of the options it declared whose value differs from their
  declared default (after the recipes: what the run really ran with);
- ``sha256``: for a local module (``--plugins ./my_reward.py`` or ``pkg.module``), the hash of its
  source file, so an edit between two invocations is seen.

The kernel's own options are recorded under the ``plasmid`` entry; an option that several plugins
declare (a family's shared options class) under the one whose provider the run uses. A plugin is *used* by the run
when it provided a chosen provider or declared an option with a non-default value
(:func:`is_used`); ``--resume`` compares the run's used plugins and nothing else
(:func:`lock_differences`), so installing or removing a plugin the run never used changes
nothing. A lock written before these fields existed counts every plugin as used.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from plasmid.config import OptionParser
from plasmid.families import FAMILIES
from plasmid.plugins import KERNEL_PLUGINS, LOCAL_DISTRIBUTION, PluginManager

if TYPE_CHECKING:
    from plasmid.startup import Startup

#: The name of the kernel's entry in a lock.
KERNEL = "plasmid"


def declared_options(manager: PluginManager) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """``({destination: [plugin name, ...]}, {destination: declared default})`` of every option the
    loaded plugins declare, found by calling their ``plasmid_addoption`` implementations one by one,
    in the order the kernel calls them, each on a parser of its own: an options class several
    plugins declare (a family's shared options) lists them all, in that order. An implementation
    that raises is left out (the start-up reported it)."""
    owners: dict[str, list[str]] = {}
    defaults: dict[str, Any] = {}
    for impl in reversed(manager.pm.hook.plasmid_addoption.get_hookimpls()):
        parser = OptionParser()
        try:
            impl.function(**{name: parser for name in impl.argnames})
        except Exception:  # noqa: BLE001 - a failing declaration is the start-up's to report
            continue
        plugin = KERNEL if impl.plugin_name in KERNEL_PLUGINS else impl.plugin_name
        declared = parser.destinations() - {"help_all"}
        for destination, default in _plain(vars(parser.defaults())).items():
            if destination in declared:
                owners.setdefault(destination, []).append(plugin)
                defaults.setdefault(destination, default)
    return owners, defaults


def used_lock(startup: Startup) -> list[dict[str, Any]]:
    """``startup.config.plugin_lock`` with every entry's ``providers`` and ``options`` (and a local
    module's ``sha256``): the module docstring's record of what the run used."""
    config, registry = startup.config, startup.registry
    lock: list[dict[str, Any]] = [{**entry, "providers": {}, "options": []} for entry in config.plugin_lock]
    by_name = {entry["name"]: entry for entry in lock}
    for entry in lock:
        if entry.get("distribution") == LOCAL_DISTRIBUTION:
            entry["sha256"] = source_digest(str(entry.get("target", "")))
    for family in FAMILIES:
        value = getattr(config.option, family.option, None)
        for chosen in value if isinstance(value, list) else [value]:
            name = str(chosen).partition(":")[0] if family.cardinality == "weighted" else chosen
            provider = registry.providers.get(family.name, {}).get(name) if name else None
            if provider is None:
                continue
            owner = by_name.get(KERNEL if provider.plugin.name in KERNEL_PLUGINS else provider.plugin.name)
            if owner is not None and name not in owner["providers"].setdefault(family.name, []):
                owner["providers"][family.name].append(name)
    owners, defaults = declared_options(startup.manager)
    values = _plain(vars(config.option))
    for destination, plugins in sorted(owners.items()):
        declarers = [by_name[plugin] for plugin in plugins if plugin in by_name]
        if not declarers or destination not in values or values[destination] == defaults.get(destination):
            continue
        # a shared options class: the declarer whose provider the run uses, else the first
        owner = next((entry for entry in declarers if entry["providers"]), declarers[0])
        owner["options"].append(destination)
    return lock


def source_digest(target: str) -> str:
    """The sha256 of a local module's source: the file ``target`` (``./my_reward.py``, locked as
    its absolute path) or the file of the imported module ``target`` (``pkg.module``); ``""``
    when there is no such file."""
    path = Path(target) if target.endswith(".py") else None
    if path is None:
        source = getattr(sys.modules.get(target), "__file__", None)
        path = Path(source) if source else None
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() if path is not None else ""
    except OSError:
        return ""


def records_use(lock: list[dict[str, Any]]) -> bool:
    """Whether ``lock`` records what the run used (written by :func:`used_lock`)."""
    return any("providers" in entry for entry in lock)


def is_used(entry: dict[str, Any]) -> bool:
    """Whether the run used the plugin of lock entry ``entry``: the kernel always; a plugin that
    provided a chosen provider or declared an option the run changed; every plugin of a lock that
    does not record use."""
    if entry.get("name") == KERNEL or "providers" not in entry:
        return True
    return bool(entry.get("providers")) or bool(entry.get("options"))


def used_options(lock: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``{destination: lock entry}`` of every option the run changed, by the plugin that declared it."""
    return {option: entry for entry in lock for option in entry.get("options", [])}


def describe(entry: dict[str, Any]) -> str:
    """A lock entry's version, or where a versionless local module came from."""
    return entry.get("version") or f"({entry.get('target', 'local module')})"


def lock_differences(before: list[dict[str, Any]], now: list[dict[str, Any]]) -> list[str]:
    """One line per difference between the run's lock ``before`` and this invocation's ``now`` that
    matters to the run: each plugin the run used (:func:`is_used`) absent now, of another
    distribution or version, or (a local module) with other source; each provider the run used
    that another plugin provides now."""
    changes = []
    current = {entry["name"]: entry for entry in now}
    for entry in before:
        if not is_used(entry):
            continue
        name, there = entry["name"], current.get(entry["name"])
        if there is None:
            changes.append(f"plugin {name} {describe(entry)} -> absent")
        elif there.get("distribution") != entry.get("distribution"):
            changes.append(f"plugin {name} {entry.get('distribution')} {describe(entry)} -> "
                           f"{there.get('distribution')} {describe(there)}")
        elif describe(there) != describe(entry):
            changes.append(f"plugin {name} {describe(entry)} -> {describe(there)}")
        elif entry.get("sha256") and there.get("sha256") != entry["sha256"]:
            changes.append(f"plugin {name} {describe(entry)}: its source changed (sha256 {entry['sha256'][:12]} -> "
                           f"{(there.get('sha256') or 'unreadable')[:12]})")
        for family, names in (entry.get("providers") or {}).items():
            for provider in names:
                holder = next((other["name"] for other in now
                               if provider in (other.get("providers") or {}).get(family, [])), None)
                if holder is not None and holder != name:
                    changes.append(f"{family} '{provider}' from plugin {name} -> from plugin {holder}")
    return changes


def _plain(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` as they read back from JSON (paths as strings, tuples as lists)."""
    return {key: json.loads(json.dumps(value, default=str)) for key, value in values.items()}


__all__ = ["KERNEL", "declared_options", "describe", "is_used", "lock_differences", "records_use", "source_digest",
           "used_lock", "used_options"]
