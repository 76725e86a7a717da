"""Configuration files: ``plasmid train --config run.yaml`` (also ``.yml``, ``.toml``, ``.json``).

A file is a mapping whose keys are the options' destinations, the Python names of the flags
(``num_rollouts: 2`` for ``--num-rollouts 2``; a key spelled with dashes is accepted too), for
every option of the kernel, the plugins and the native pass-through ones (``sglang_mem_fraction_static``).
Keys may also be nested one level under a section named after a plugin or an option group
(``grpo: {eps_clip: 0.2}``); a section is only a way to arrange the file, its keys are the same
flat names. ``null`` means "not set" (the option's default, or the recipe's).

The ``config.json`` a run writes (``{"option": {...}, "plugin_lock": [...], "run_dir": ...}``)
is itself a valid file: its ``option`` mapping is read, and the values the kernel derives at
start-up (:data:`DERIVED_KEYS`) are skipped. It stays valid when plugins come and go: its lock
records what the run used (:mod:`plasmid.app.runlock`), so a key no loaded plugin declares now is
left out when the run left it at its default (its plugin was installed then, unused), and is a
one-line error naming the option, the plugin, its distribution and the run's lock when the run set
it; with ``--resume-allow-changes`` (:func:`reader`) that is a warning and the key is left out.
The same holds for the plugins its ``plugins:`` selection names and for its chosen providers
(``--reward``, ``--filter``, ...) whose plugin, used by the run, is not installed now.

Reading checks only the file's syntax and shape (one-line :class:`plasmid.errors.UsageError`
naming the file); which keys exist is checked against the declared options by :func:`values`,
which :meth:`plasmid.config.OptionParser.parse` calls (this module is the parser's
:class:`plasmid.config.ConfigFiles`) after the plugins (which the file may select with
``plugins:``) are loaded. YAML needs PyYAML (``pip install 'plasmid[yaml]'``); TOML uses the
standard library's :mod:`tomllib`.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
import tomllib
from pathlib import Path
from typing import Any

import plasmid
from plasmid.app.runlock import KERNEL, is_used, records_use, used_options
from plasmid.errors import UsageError, did_you_mean
from plasmid.families import FAMILIES, Family
from plasmid.plugins import LOCAL_DISTRIBUTION, installed_entry_points

#: The run's lock beside its ``config.json`` (:mod:`plasmid.app.rundir` writes both).
LOCK_NAME = "plugins.lock.json"

#: The options that choose providers, and their families.
FAMILY_OPTIONS = {family.option: family for family in FAMILIES}

#: Keys of a run's ``config.json`` that are derived at start-up, not options (skipped when read).
DERIVED_KEYS = frozenset({"reward_weights"})

#: The file suffixes understood, and the format of each.
FORMATS = {".yaml": "yaml", ".yml": "yaml", ".toml": "toml", ".json": "json"}


def read_file(path: str | Path) -> dict[str, Any]:
    """The top-level mapping of the configuration file at ``path`` (a run's ``config.json``: its
    ``option`` mapping, less :data:`DERIVED_KEYS`). One-line ``UsageError`` for a missing or
    unreadable file, an unknown suffix, a syntax error (with its line) or a top level that is
    not a mapping."""
    return _read(path)[0]


def _read(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]] | None]:
    """:func:`read_file`'s mapping, and the lock of a run's ``config.json`` that records what the
    run used (:func:`plasmid.app.runlock.records_use`; else ``None``)."""
    path = Path(path)
    kind = FORMATS.get(path.suffix.lower())
    if kind is None:
        raise UsageError(f"--config {path}: unknown file type {path.suffix or '(no suffix)'!r}; "
                         f"use {', '.join(FORMATS)}")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"--config {path}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"--config {path}: is a directory, not a file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--config {path}: cannot read it ({exc})") from None
    data = _parse(path, kind, text)
    if data is None and kind == "yaml":
        data = {}
    if not isinstance(data, dict):
        raise UsageError(f"--config {path}: expected a mapping of option names to values at the top, "
                         f"got {type(data).__name__}")
    if isinstance(data.get("option"), dict) and "plugin_lock" in data:   # a run's config.json
        lock = data["plugin_lock"]
        data = {key: value for key, value in data["option"].items() if key not in DERIVED_KEYS}
        if isinstance(lock, list) and all(isinstance(entry, dict) and "name" in entry for entry in lock) \
                and records_use(lock):
            return data, lock
    return data, None


def _parse(path: Path, kind: str, text: str) -> Any:
    if kind == "toml":
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise UsageError(f"--config {path}: invalid TOML: {exc}") from None
    if kind == "json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise UsageError(f"--config {path}: invalid JSON: {exc}") from None
    try:
        yaml: Any = importlib.import_module("yaml")
    except ImportError:
        raise UsageError(f"--config {path}: reading YAML needs PyYAML: pip install 'plasmid[yaml]' "
                         f"(or use a .toml or .json file)") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UsageError(f"--config {path}: invalid YAML{where}: {problem}") from None


def plugins_in(paths: list[str], *, warned: set[str] | None = None) -> str | None:
    """The plugin selection (``plugins:`` at the top) of the last of the files ``paths`` that
    has one, or ``None``: read before the plugins load, since they decide which options exist.

    In a run's ``config.json`` that records what the run used, a plugin that is not installed now
    is left out of the selection (``no:NAME`` too) when the run did not use it; one it used is a
    one-line error naming it and the run's lock (with ``warned``, for ``--resume-allow-changes``:
    a warning, and left out; ``warned`` holds the warnings given, each given once)."""
    selection = None
    for path in paths:
        data, lock = _read(path)
        value = data.get("plugins")
        if value is not None:
            if isinstance(value, list):
                value = ",".join(map(str, value))
            if not isinstance(value, str):
                raise UsageError(f"--config {path}: plugins: expected a string (a,b | no:a | ./file.py), got {value!r}")
            selection = value if lock is None else _installed_selection(path, value, lock, warned)
    return selection


def _installed_selection(path: str, value: str, lock: list[dict[str, Any]], warned: set[str] | None) -> str:
    """``value`` (a run's ``--plugins``) without the plugins that are not installed now (see
    :func:`plugins_in`)."""
    installed, entries = installed_entry_points(), {entry["name"]: entry for entry in lock}
    kept = []
    for item in (part.strip() for part in value.split(",")):
        name = item.removeprefix("no:")
        if not item or name in installed or "/" in name or "." in name or name.endswith(".py"):
            kept.append(item)
            continue
        entry = entries.get(name)
        if entry is not None and is_used(entry) and not item.startswith("no:"):
            _refuse(f"--config {path}: plugins: plugin {_label(entry)}, which the run used (its lock: "
                    f"{Path(path).parent / LOCK_NAME}), is not installed now", _fix(entry), warned)
    return ",".join(kept)


def _label(entry: dict[str, Any]) -> str:
    if entry.get("distribution") == LOCAL_DISTRIBUTION:
        return f"'{entry['name']}' (local module {entry.get('target')})"
    return f"'{entry['name']}' (distribution {entry.get('distribution')} {entry.get('version')})"


def _fix(entry: dict[str, Any]) -> str:
    if entry.get("distribution") == LOCAL_DISTRIBUTION:
        return f"add it back (--plugins {entry.get('target')})"
    if entry["name"] == KERNEL:
        return f"install it (pip install plasmid=={entry.get('version')})"
    return f"install it (pip install {entry.get('distribution')}=={entry.get('version')})"


def _refuse(problem: str, fix: str, warned: set[str] | None) -> None:
    """A one-line ``UsageError``; with ``warned`` (``--resume-allow-changes``: the messages warned
    so far, each said once) a warning that the key is left out."""
    if warned is None:
        raise UsageError(f"{problem}; {fix}, or accept the change with --resume-allow-changes")
    if problem not in warned:
        warned.add(problem)
        print(f"plasmid: warning: {problem}; left out (--resume-allow-changes)", file=sys.stderr, flush=True)


def _state(entry: dict[str, Any]) -> tuple[str, str]:
    """Why the plugin of lock entry ``entry`` declares no option now, and the fix."""
    if entry["name"] == KERNEL:
        return f"this is plasmid {plasmid.__version__}, which does not declare it", _fix(entry)
    if entry.get("distribution") == LOCAL_DISTRIBUTION:
        return "it is not loaded now", _fix(entry)
    found = installed_entry_points().get(entry["name"])
    if found is None or found.dist is None:
        return "it is not installed now", _fix(entry)
    if (found.dist.name, found.dist.version) != (entry.get("distribution"), entry.get("version")):
        return (f"{found.dist.name} {found.dist.version} is installed now, which does not declare it",
                _fix(entry).replace("install it", "install the run's version"))
    return "it is not selected now", f"select it (--plugins ...,{entry['name']})"


def _installed_providers(path: str, family: Family, value: Any, lock: list[dict[str, Any]],
                         warned: set[str] | None) -> Any:
    """``value`` (a run's choice of ``family``) without the providers whose plugin, used by the run,
    is not installed now: refused (:func:`_refuse`), or (``warned``: ``--resume-allow-changes``)
    left out (a one-provider family's choice becomes unset: the default then)."""
    chosen = value if isinstance(value, list) else [value]
    kept = []
    for item in chosen:
        name = str(item).partition(":")[0] if family.cardinality == "weighted" else item
        entry = next((entry for entry in lock if name in (entry.get("providers") or {}).get(family.name, [])), None)
        if entry is None or entry["name"] == KERNEL or _present(entry):
            kept.append(item)
            continue
        _refuse(f"--config {path}: {family.option}: {family.name} '{name}' is provided by plugin {_label(entry)}, "
                f"which the run used (its lock: {Path(path).parent / LOCK_NAME}), but it is not installed now",
                _fix(entry), warned)
    return kept if isinstance(value, list) else (kept or [None])[0]


def _present(entry: dict[str, Any]) -> bool:
    """Whether the plugin of lock entry ``entry`` is installed now (a local module: its file exists)."""
    if entry.get("distribution") == LOCAL_DISTRIBUTION:
        target = str(entry.get("target", ""))
        return Path(target).is_file() if target.endswith(".py") else importlib.util.find_spec(target) is not None
    return entry["name"] in installed_entry_points()


def _declared_now(path: str, data: dict[str, Any], lock: list[dict[str, Any]], options: set[str],
                  warned: set[str] | None) -> dict[str, Any]:
    """``data`` (a run's options) without the keys no loaded plugin declares now: one the run set
    (its plugin is recorded using it) is refused (:func:`_refuse`), the others, which the run left
    at their defaults, are left out silently."""
    used, kept = used_options(lock), {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        entry = used.get(name)
        if name in FAMILY_OPTIONS and name in options:
            kept[key] = _installed_providers(path, FAMILY_OPTIONS[name], value, lock, warned)
        elif name in options or isinstance(value, dict):
            kept[key] = value
        elif entry is not None:
            state, fix = _state(entry)
            _refuse(f"--config {path}: option '{name}' (the run set it to {json.dumps(value)}) is declared by "
                    f"plugin {_label(entry)}, which the run used (its lock: {Path(path).parent / LOCK_NAME}), but "
                    f"{state}", fix, warned)
    return kept


def flatten(data: dict[str, Any], options: set[str], sections: set[str], path: str) -> dict[str, Any]:
    """``data`` with one level of sections folded in and keys as destinations (dashes become
    underscores): ``{name: value}``.

    :param options: the declared destinations; a key among them is a value, even a mapping,
        unless the key also names a section (``rollout`` is an option and a group).
    :param sections: the names a section may have (plugins, option groups).
    Raises ``UsageError`` (with "did you mean") on an unknown key or section, and on a key given
    twice (at the top and in a section, or in two sections).
    """
    flat: dict[str, Any] = {}
    where: dict[str, str] = {}

    def put(key: str, value: Any, section: str) -> None:
        name = key.replace("-", "_")
        here = f"{section}.{key}" if section else key
        if name not in options:
            raise UsageError(f"--config {path}: unknown option {here!r}{did_you_mean(name, options)}")
        if name in flat:
            raise UsageError(f"--config {path}: option {name!r} is set twice ({where[name]} and {here})")
        flat[name], where[name] = value, here

    for key, value in data.items():
        key = str(key)
        if not isinstance(value, dict) or (key.replace("-", "_") in options and key not in sections):
            put(key, value, "")    # a mapping under a name that is both (rollout) is the section
            continue
        if key not in sections:
            hint = did_you_mean(key, sections | options)
            raise UsageError(f"--config {path}: unknown section {key!r}{hint} (a section is a plugin's or an "
                             f"option group's name)")
        for inner, inner_value in value.items():
            put(str(inner), inner_value, key)
    return flat


def values(path: str, options: set[str], sections: set[str], *, warned: set[str] | None = None) -> dict[str, Any]:
    """``{destination: value}`` of the file at ``path`` (:func:`flatten` of :func:`read_file`); a
    section may also be named after an installed plugin. A run's ``config.json`` loses the keys
    no loaded plugin declares now as the module docstring says (``warned`` as for
    :func:`plugins_in`)."""
    data, lock = _read(path)
    if lock is not None:
        data = _declared_now(path, data, lock, options, warned)
    return flatten(data, options, sections | set(installed_entry_points()), path)


class Reader:
    """The ``--config`` reader (:class:`plasmid.config.ConfigFiles`) of a command line: this
    module's :func:`plugins_in` and :func:`values`, with ``allow_changes`` when the command line
    has ``--resume-allow-changes``."""

    def __init__(self, allow_changes: bool = False) -> None:
        self.allow_changes = allow_changes
        #: the warnings given (files are read more than once; each is said once)
        self.warned: set[str] | None = set() if allow_changes else None

    def plugins_in(self, paths: list[str]) -> str | None:
        return plugins_in(paths, warned=self.warned)

    def values(self, path: str, options: set[str], sections: set[str]) -> dict[str, Any]:
        return values(path, options, sections, warned=self.warned)


def reader(argv: list[str]) -> Reader:
    """The :class:`Reader` of command line ``argv`` (``@files`` included; the last of
    ``--resume-allow-changes`` / ``--no-resume-allow-changes`` wins)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, fromfile_prefix_chars="@")
    parser.add_argument("--resume-allow-changes", action=argparse.BooleanOptionalAction, default=False)
    try:
        known, _ = parser.parse_known_args(argv)
    except (SystemExit, OSError):   # a bad @file or value: the command's own parser reports it
        return Reader()
    return Reader(bool(known.resume_allow_changes))


def debug_requested(argv: list[str]) -> bool:
    """Whether ``argv`` asks for tracebacks: ``--debug`` (or ``--no-debug``) on the command line or
    in an ``@args.txt`` file, the last one winning; else ``debug:`` in the last ``--config`` file
    that sets it (at the top or under its ``general`` section, true for a YAML ``true`` or TOML
    ``true``). Never raises: a file it cannot read (whose error the command reports itself)
    counts as not asking."""
    import argparse

    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, fromfile_prefix_chars="@")
    parser.add_argument("--debug", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--config", action="append", default=[])
    try:
        known, _ = parser.parse_known_args(argv)
    except (SystemExit, OSError):
        return "--debug" in argv
    if known.debug is not None:
        return bool(known.debug)
    found = False
    for path in known.config:
        try:
            data = read_file(path)
        except UsageError:
            continue
        general = data.get("general")
        value = general.get("debug") if isinstance(general, dict) and "debug" in general else data.get("debug")
        if value is not None:
            found = value is True
    return found


__all__ = ["DERIVED_KEYS", "FORMATS", "LOCK_NAME", "Reader", "debug_requested", "flatten", "plugins_in", "read_file",
           "reader", "values"]
