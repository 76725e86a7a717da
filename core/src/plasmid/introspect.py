"""``plasmid plugins``: what is installed, what each plugin provides, and whether it imports.

Works when an installed plugin is broken: listing loads tolerantly and shows the reason.

``plasmid plugins show NAME`` also imports the plugin's providers to describe each one: the
first line of its factory's docstring, and the options it reads when the factory lists them: as
``option_classes`` (a tuple of :class:`plasmid.options.Options` classes), or, for plugins written
before typed options, as ``reads_options`` (option names in Python form, ``("eps_clip",)``).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import warnings
from typing import Any, TypedDict

from plasmid.config import OptionParser
from plasmid.errors import PluginError
from plasmid.kernel_options import KERNEL_OPTIONS
from plasmid.options import walk_fields
from plasmid.plugins import (
    PluginInfo,
    PluginManager,
    Selection,
    did_you_mean,
    installed_entry_points,
    kernel_incompatibility,
)
from plasmid.registry import Registry


def plugins_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="plasmid plugins", description="List, show and check plasmid plugins.")
    parser.add_argument("action", nargs="?", default="list", choices=["list", "show", "check"])
    parser.add_argument("name", nargs="?", help="plugin name (for show)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--plugins", default=None, help="selection, as for 'plasmid train'")
    parser.add_argument("--debug", action="store_true")
    args = parser.parse_args(argv)
    if args.action == "check":
        return check_plugins(args.json)
    manager, registry = load_tolerantly(args.plugins)
    if args.action == "show":
        if not args.name:
            parser.error("show needs a plugin NAME")
        return show_plugin(manager, args.name, args.json, registry)
    return list_plugins(manager, args.json)


def load_tolerantly(plugins_flag: str | None) -> tuple[PluginManager, Registry]:
    manager = PluginManager()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        manager.load(Selection.from_env_or_flag(plugins_flag, installed_entry_points(), dict(os.environ)),
                     tolerant=True)
    return manager, Registry.collect(manager, tolerant=True)


def _row(info: PluginInfo) -> str:
    providers = "; ".join(f"{family}: {', '.join(names)}" for family, names in sorted(info.providers.items()))
    status = info.status + (f": {info.reason}" if info.reason and info.status != "loaded" else "")
    return f"{info.name:<16} {info.distribution + ' ' + info.version:<28} {status}\n{'':<16} {providers or '-'}"


def list_plugins(manager: PluginManager, as_json: bool) -> int:
    if as_json:
        print(json.dumps(manager.report(), indent=1))
        return 0
    for info in manager.infos.values():
        print(_row(info))
    return 0


def plugin_options(manager: PluginManager, name: str) -> list[dict[str, Any]]:
    """The options plugin ``name`` adds, as ``{flag, default, help}``."""
    plugin = manager.pm.get_plugin(name)
    impl = getattr(plugin, "plasmid_addoption", None)
    if impl is None:
        return []
    parser = OptionParser()
    impl(parser=parser)
    options = []
    for action in parser._parser._actions:
        if action.option_strings and action.dest != "help":
            options.append({"flag": action.option_strings[0], "default": action.default, "help": action.help or ""})
    return options


def all_options(manager: PluginManager) -> dict[str, dict[str, Any]]:
    """Every option of the kernel and the loaded plugins, by Python name, as ``{flag, default, help}``."""
    parser = OptionParser()
    manager.addoption(parser)
    return {action.dest: {"flag": action.option_strings[0], "default": action.default, "help": action.help or ""}
            for action in parser._parser._actions if action.option_strings and action.dest != "help"}


def provider_details(registry: Registry, name: str) -> list[dict[str, Any]]:
    """The providers plugin ``name`` registers, each imported: ``{family, name, summary, reads}``
    (``reads``: :func:`options_read` of its factory; a factory that fails to import gets the
    reason as its summary)."""
    details = []
    for family, providers in registry.providers.items():
        for provider in providers.values():
            if provider.plugin.name != name:
                continue
            try:
                factory = provider.load()
            except PluginError as exc:
                details.append({"family": family, "name": provider.name, "summary": f"(not importable: {exc})",
                                "reads": []})
                continue
            doc = inspect.getdoc(factory) or ""
            details.append({"family": family, "name": provider.name, "summary": doc.splitlines()[0] if doc else "",
                            "reads": options_read(factory)})
    return details


def options_read(factory: Any) -> list[str]:
    """The option names a provider reads: the fields of its ``option_classes`` (a tuple of
    :class:`plasmid.options.Options` classes) but the kernel's own, which every run has, or the
    names in an older ``reads_options``."""
    classes = [cls for cls in getattr(factory, "option_classes", ()) if cls not in KERNEL_OPTIONS]
    names = [field_.name for field_ in walk_fields(classes)]
    return names + [name for name in getattr(factory, "reads_options", ()) if name not in names]


def options_shown(manager: PluginManager, name: str, providers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The plugin's own options, then those its providers read, each once as ``{flag, default,
    help, read_by}``; ``read_by`` names the providers that read it when not all of them do."""
    known = all_options(manager)
    shown = {option["flag"]: {**option, "read_by": []} for option in plugin_options(manager, name)}
    readers: dict[str, list[str]] = {}
    for provider in providers:
        for dest in provider["reads"]:
            readers.setdefault(dest, []).append(provider["name"])
    for dest, names in readers.items():
        option = known.get(dest, {"flag": dest, "default": None, "help": "(not declared by any loaded plugin)"})
        partial = names if len(names) < len(providers) else []
        shown.setdefault(option["flag"], {**option, "read_by": partial})
    return list(shown.values())


def show_plugin(manager: PluginManager, name: str, as_json: bool, registry: Registry | None = None) -> int:
    info = manager.infos.get(name)
    if info is None:
        raise PluginError(f"no plugin named '{name}'{did_you_mean(name, manager.infos)}")
    usable = info.status in ("loaded", "kernel")
    providers = provider_details(registry, name) if usable and registry is not None else []
    options = options_shown(manager, name, providers) if usable else []
    if as_json:
        print(json.dumps({**info.__dict__, "options": options, "provider_details": providers}, indent=1,
                         default=str))
        return 0
    print(_row(info))
    print(f"{'':<16} target: {info.target}")
    print(f"{'':<16} hooks: {', '.join(info.hooks) or '-'}")
    for provider in providers:
        print(f"{'':<16} {provider['family']} {provider['name']}: {provider['summary']}")
    for option in options:
        only = f" [{', '.join(option['read_by'])}]" if option["read_by"] else ""
        print(f"{'':<16} {option['flag']:<28} {option['help']}{only}")
    return 0


CHECK_SNIPPET = """
import importlib.metadata as m, sys, time
ep = {e.name: e for e in m.entry_points(group="plasmid")}[sys.argv[1]]
t = time.perf_counter(); ep.load(); print(time.perf_counter() - t)
"""


class PluginCheck(TypedDict):
    """One plugin's line of ``plasmid plugins check`` (``--json``: one object of the list)."""

    name: str
    distribution: str
    version: str
    ok: bool
    import_seconds: float | None
    error: str


def check_plugins(as_json: bool) -> int:
    """Import every installed plugin in a fresh interpreter; report failures and import time."""
    results: list[PluginCheck] = []
    for name, ep in sorted(installed_entry_points().items()):
        result = PluginCheck(name=name, distribution=ep.dist.name if ep.dist else "?",
                             version=ep.dist.version if ep.dist else "", ok=False, import_seconds=None, error="")
        problem = kernel_incompatibility(ep.dist)
        if problem:
            result["error"] = problem
        else:
            proc = subprocess.run([sys.executable, "-c", CHECK_SNIPPET, name], capture_output=True, text=True,
                                  timeout=300)
            if proc.returncode == 0:
                result["ok"], result["import_seconds"] = True, float(proc.stdout.strip().splitlines()[-1])
            else:
                last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
                result["error"] = f"import failed: {last}"
        results.append(result)
    if as_json:
        print(json.dumps(results, indent=1))
    else:
        for r in results:
            state = f"ok {r['import_seconds']:.2f}s" if r["ok"] else f"FAILED: {r['error']}"
            print(f"{r['name']:<16} {r['distribution'] + ' ' + r['version']:<28} {state}")
    return 0 if all(r["ok"] for r in results) else 1
