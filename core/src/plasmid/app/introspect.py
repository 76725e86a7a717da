"""``plasmid plugins``: what is installed, what each plugin provides, and whether it imports.

Works when an installed plugin is broken: listing loads tolerantly (and declares every plugin's
options on a throwaway parser, so one whose ``plasmid_addoption`` raises is listed as skipped)
and shows the reason.

``plasmid plugins show NAME`` also imports the plugin's providers to describe each one: the
first line of its factory's docstring, and the options it reads when the factory lists them: as
``option_classes`` (a tuple of :class:`plasmid.options.Options` classes), or, for plugins written
before typed options, as ``reads_options`` (option names in Python form, ``("eps_clip",)``).
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import warnings
from typing import Any, TypedDict

from plasmid.config import ArgumentParser, Config, OptionParser, help_of
from plasmid.errors import PlasmidError, PluginError
from plasmid.kernel_options import KERNEL_OPTIONS
from plasmid.options import walk_fields
from plasmid.plugins import (
    PluginInfo,
    PluginManager,
    Selection,
    did_you_mean,
    installed_entry_points,
    is_first_party,
    kernel_incompatibility,
)
from plasmid.registry import Registry
from plasmid.startup import finish_configuration, resolve_choices


def plugins_command(argv: list[str]) -> int:
    parser = ArgumentParser(prog="plasmid plugins", description="List, show and check plasmid plugins.")
    parser.add_argument("action", nargs="?", default="list", choices=["list", "show", "check"])
    parser.add_argument("name", nargs="?", help="plugin name (for show)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--plugins", default=None, help="selection, as for 'plasmid train'")
    parser.add_argument("--debug", action="store_true")
    args = parser.parse_args(argv)
    if args.action == "check":
        return check_plugins(args.json, args.plugins)
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
        registry = Registry.collect(manager, tolerant=True)
        manager.addoption(OptionParser())  # tolerant: a plugin that fails in it is marked skipped
    registry.prune()
    return manager, registry


def _row(info: PluginInfo) -> str:
    providers = "; ".join(f"{family}: {', '.join(names)}" for family, names in sorted(info.providers.items()))
    status = info.status + (f": {info.reason}" if info.reason and info.status != "loaded" else "")
    problems = "".join(f"\n{'':<16} {problem}" for problem in info.problems)
    return (f"{info.name:<16} {info.distribution + ' ' + info.version:<28} {status}\n{'':<16} {providers or '-'}"
            f"{problems}")


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
    declared = parser.destinations()
    for action in parser._parser._actions:
        if action.option_strings and action.dest in declared:
            options.append({"flag": action.option_strings[0], "default": action.default, "help": help_of(action)})
    return options


def all_options(manager: PluginManager) -> dict[str, dict[str, Any]]:
    """Every option of the kernel and the loaded plugins, by Python name, as ``{flag, default, help}``."""
    parser = OptionParser()
    manager.addoption(parser)
    declared = parser.destinations()
    return {action.dest: {"flag": action.option_strings[0], "default": action.default, "help": help_of(action)}
            for action in parser._parser._actions if action.option_strings and action.dest in declared}


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
import json, sys
from plasmid.app.introspect import check_in_this_process
print(json.dumps(check_in_this_process(sys.argv[1])))
"""


class PluginCheck(TypedDict):
    """One plugin's entry of ``plasmid plugins check --json`` (the output is a list of them).

    :ivar problems: one line each; empty when the plugin passed.
    :ivar error: the problems joined with ``" | "`` (``""`` when ok).
    :ivar providers: ``[family, name]`` of every provider it registers.
    """

    name: str
    distribution: str
    version: str
    ok: bool
    import_seconds: float | None
    problems: list[str]
    error: str
    providers: list[list[str]]


def check_in_this_process(name: str) -> dict[str, Any]:
    """Check installed plugin ``name`` in this (fresh) process, as ``plasmid plugins check`` does:
    import it, register it (hook arguments against the hookspecs), look for hooks plasmid does
    not define, call its registration hooks, import every lazy target it registers, then call
    its bootstrap hooks (:func:`bootstrap_on_defaults`).

    :returns: ``{"import_seconds": float | None, "problems": [str], "providers": [[family, name]]}``.
    """
    import time

    ep = installed_entry_points()[name]
    result: dict[str, Any] = {"import_seconds": None, "problems": [], "providers": []}
    started = time.perf_counter()
    try:
        obj = ep.load()
    except Exception as exc:  # noqa: BLE001 - reported, named
        result["problems"].append(f"failed to import {ep.value}: {type(exc).__name__}: {exc}")
        return result
    result["import_seconds"] = time.perf_counter() - started
    manager = PluginManager()
    manager.load_kernel_plugins()
    manager.tolerant = True
    info = PluginInfo(name, ep.dist.name if ep.dist else "?", ep.dist.version if ep.dist else "", ep.value,
                      origin="selection")
    manager.infos[name] = info
    manager._register(obj, info)
    if info.status == "loaded":
        manager.check()
    if info.status == "loaded":
        registry = Registry.collect(manager, tolerant=True)
        result["problems"] += info.problems
        for family, providers in registry.providers.items():
            for provider in providers.values():
                if provider.plugin is not info:
                    continue
                result["providers"].append([family, provider.name])
                try:
                    provider.load()
                except PluginError as exc:
                    result["problems"].append(str(exc))
        bootstrap_on_defaults(manager, registry)
    if info.status == "skipped":
        result["problems"].append(info.reason)
    return result


def bootstrap_on_defaults(manager: PluginManager, registry: Registry) -> None:
    """Call the bootstrap hooks of ``manager``'s plugins as a run would, on a throwaway parser and
    a configuration of every option's default (provider choices resolved where the loaded plugins
    decide them; the run directory a temporary one that is never written to), so that a plugin
    whose ``plasmid_addoption``, ``plasmid_defaults`` or ``plasmid_configure`` raises is marked
    skipped (``manager`` is tolerant). A :class:`PlasmidError` from a defaults or configure hook
    is the plugin refusing these defaults (a usage error a user would fix), not a fault: ignored."""
    import tempfile
    from pathlib import Path

    parser = OptionParser()
    manager.addoption(parser)
    with tempfile.TemporaryDirectory(prefix="plasmid-plugins-check-") as scratch:
        config = Config(option=parser.defaults(), plugin_lock=manager.lock(), run_dir=Path(scratch) / "run")
        try:
            resolve_choices(config, registry, strict=False)
            finish_configuration(config, manager, parser.option_classes)
        except PlasmidError:
            pass


def check_plugins(as_json: bool, plugins_flag: str | None = None) -> int:
    """``plasmid plugins check``: validate the installed plugins (those ``--plugins`` selects;
    default all) without running a training.

    Checked: the declared ``plasmid`` requirement (from metadata, before import); then, each in
    a fresh interpreter: that it imports (and how long that takes), that every hook it implements
    exists (a misspelled name) and takes only arguments its hookspec declares, that its
    registration hooks run, that every lazy ``"module:attr"`` target it registers imports, and
    that its bootstrap hooks run on a throwaway parser and configuration (:func:`bootstrap_on_defaults`);
    then, across the checked plugins, provider names registered twice in a family (reported on
    the plugin that loses the name, in the registration order of :mod:`plasmid.plugins`). Local
    modules (``--plugins ./file.py``) are not checked.

    Output: one line per problem, ``NAME (DIST VERSION): PROBLEM``, then a summary line;
    ``--json``: a list of :class:`PluginCheck`.

    :returns: the exit code: 0 when no problem was found, 1 when any was. (A bad ``--plugins``
        value is a :class:`PluginError`: exit 2, as for every command.)
    """
    from concurrent.futures import ThreadPoolExecutor

    installed = installed_entry_points()
    selection = Selection.from_env_or_flag(plugins_flag, installed, dict(os.environ))
    for name in [*selection.include, *selection.exclude]:
        if name not in installed:
            raise PluginError(f"unknown plugin '{name}' in --plugins{did_you_mean(name, installed)}")
    chosen = [(name, ep) for name, ep in sorted(installed.items(), key=lambda item: (
        not is_first_party(item[1].dist.name if item[1].dist else ""), item[0]))
        if name not in selection.exclude and (selection.autoload or name in selection.include)]

    def check_one(name: str, ep: Any) -> PluginCheck:
        result = PluginCheck(name=name, distribution=ep.dist.name if ep.dist else "?",
                             version=ep.dist.version if ep.dist else "", ok=False, import_seconds=None,
                             problems=[], error="", providers=[])
        problem = kernel_incompatibility(ep.dist)
        if problem:
            result["problems"].append(problem)
            return result
        try:
            proc = subprocess.run([sys.executable, "-c", CHECK_SNIPPET, name], capture_output=True, text=True,
                                  timeout=300)
        except subprocess.TimeoutExpired:
            result["problems"].append("checking it took over 300 s (does importing it hang?)")
            return result
        try:
            found = json.loads(proc.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            result["problems"].append(f"checking it crashed the interpreter (exit {proc.returncode}): {last}")
            return result
        result["import_seconds"], result["providers"] = found["import_seconds"], found["providers"]
        result["problems"] += found["problems"]
        return result

    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        results = list(pool.map(lambda item: check_one(*item), chosen))
    _add_collisions(results)
    for result in results:
        result["ok"] = not result["problems"]
        result["error"] = " | ".join(result["problems"])
    if as_json:
        print(json.dumps(results, indent=1))
    else:
        for r in results:
            for problem in r["problems"]:
                print(f"{r['name']} ({r['distribution']} {r['version']}): {problem}")
        count = sum(len(r["problems"]) for r in results)
        print(f"plasmid plugins check: {len(results)} plugins checked, {count} problem{'s' * (count != 1)}")
    return 0 if all(r["ok"] for r in results) else 1


def _add_collisions(results: list[PluginCheck]) -> None:
    """Add a problem to each plugin that registers a provider name the kernel or an earlier
    plugin of ``results`` (which are in registration order) registers in the same family."""
    kernel = PluginManager()
    kernel.load_kernel_plugins()
    owners: dict[tuple[str, str], str] = {}
    for family, providers in Registry.collect(kernel).providers.items():
        for name in providers:
            owners[(family, name)] = "the kernel (plasmid)"
    for result in results:
        label = f"'{result['name']}' (distribution {result['distribution']} {result['version']})"
        for family, name in result["providers"]:
            owner = owners.setdefault((family, name), label)
            if owner != label:
                result["problems"].append(
                    f"{family} '{name}' skipped: the name is taken: {owner} registers it first (when this plugin "
                    f"is selected with --plugins, an error)")
