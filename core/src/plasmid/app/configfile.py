"""Configuration files: ``plasmid train --config run.yaml`` (also ``.yml``, ``.toml``, ``.json``).

A file is a mapping whose keys are the options' destinations, the Python names of the flags
(``num_rollouts: 2`` for ``--num-rollouts 2``; a key spelled with dashes is accepted too), for
every option of the kernel, the plugins and the native pass-through ones (``sglang_mem_fraction_static``).
Keys may also be nested one level under a section named after a plugin or an option group
(``grpo: {eps_clip: 0.2}``); a section is only a way to arrange the file, its keys are the same
flat names. ``null`` means "not set" (the option's default, or the recipe's).

The ``config.json`` a run writes (``{"option": {...}, "plugin_lock": [...], "run_dir": ...}``)
is itself a valid file: its ``option`` mapping is read, and the values the kernel derives at
start-up (:data:`DERIVED_KEYS`) are skipped.

Reading checks only the file's syntax and shape (one-line :class:`plasmid.errors.UsageError`
naming the file); which keys exist is checked against the declared options by :func:`values`,
which :meth:`plasmid.config.OptionParser.parse` calls (this module is the parser's
:class:`plasmid.config.ConfigFiles`) after the plugins (which the file may select with
``plugins:``) are loaded. YAML needs PyYAML (``pip install 'plasmid[yaml]'``); TOML uses the
standard library's :mod:`tomllib`.
"""

from __future__ import annotations

import importlib
import json
import tomllib
from pathlib import Path
from typing import Any

from plasmid.errors import UsageError, did_you_mean
from plasmid.plugins import installed_entry_points

#: Keys of a run's ``config.json`` that are derived at start-up, not options (skipped when read).
DERIVED_KEYS = frozenset({"reward_weights"})

#: The file suffixes understood, and the format of each.
FORMATS = {".yaml": "yaml", ".yml": "yaml", ".toml": "toml", ".json": "json"}


def read_file(path: str | Path) -> dict[str, Any]:
    """The top-level mapping of the configuration file at ``path`` (a run's ``config.json``: its
    ``option`` mapping, less :data:`DERIVED_KEYS`). One-line ``UsageError`` for a missing or
    unreadable file, an unknown suffix, a syntax error (with its line) or a top level that is
    not a mapping."""
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
        data = {key: value for key, value in data["option"].items() if key not in DERIVED_KEYS}
    return data


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


def plugins_in(paths: list[str]) -> str | None:
    """The plugin selection (``plugins:`` at the top) of the last of the files ``paths`` that
    has one, or ``None``: read before the plugins load, since they decide which options exist."""
    selection = None
    for path in paths:
        value = read_file(path).get("plugins")
        if value is not None:
            if isinstance(value, list):
                value = ",".join(map(str, value))
            if not isinstance(value, str):
                raise UsageError(f"--config {path}: plugins: expected a string (a,b | no:a | ./file.py), got {value!r}")
            selection = value
    return selection


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


def values(path: str, options: set[str], sections: set[str]) -> dict[str, Any]:
    """``{destination: value}`` of the file at ``path`` (:func:`flatten` of :func:`read_file`); a
    section may also be named after an installed plugin."""
    return flatten(read_file(path), options, sections | set(installed_entry_points()), path)


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


__all__ = ["DERIVED_KEYS", "FORMATS", "debug_requested", "flatten", "plugins_in", "read_file", "values"]
