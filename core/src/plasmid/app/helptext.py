"""``plasmid train --help`` that a person can read: common options first, then by plugin.

The full listing (argparse's, every group in declaration order) is ``--help-all``. This one:

1. ``common: ...`` sections (:data:`COMMON`): what a new user sets first (model and data, the
   algorithm, the schedule, the runtime), each option wherever it is declared;
2. the rest of the kernel's options, by group;
3. each plugin's options, under ``plugin NAMES (DISTRIBUTION VERSION)``: an option belongs to the
   distribution whose package declares its :class:`plasmid.options.Options` class (a library
   shared by several plugins, ``plasmid-torch``, gets its own heading);
4. options declared without an options class (``parser.addoption``) by group;
5. native pass-through groups (titles ending in :data:`NATIVE_SUFFIX`, the ``--megatron-*`` and
   ``--sglang-*`` fields of a framework) as one line each: how many, their flag prefix, and how
   to list them (``--help-all``, ``plasmid plugins show NAME``).

Every option shows its default (``none`` when it has none).
"""

from __future__ import annotations

import argparse
import copy
import os
from collections.abc import Iterable
from importlib import metadata
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from plasmid.options import Options

#: Section title -> the option destinations shown first, in order (those declared).
COMMON: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("model and data", ("config", "model", "tokenizer", "datasource", "task", "prompt_data", "input_key",
                        "label_key", "run_dir", "resume", "seed")),
    ("algorithm", ("loss", "reward", "filter", "lr", "n_samples_per_prompt", "temperature", "max_new_tokens",
                   "kl_coef", "eps_clip")),
    ("schedule", ("num_rollouts", "prompts_per_step", "global_batch_size", "micro_batch_size", "eval_interval",
                  "save_interval", "schedule", "placement", "engines", "trainer_workers")),
    ("runtime", ("runtime", "engine", "trainer", "generate", "rollout", "weight_sync", "tools", "plugins",
                 "debug")),
)

#: The column where option help starts (argparse's default is 24, which puts most flags on a line
#: of their own).
HELP_POSITION = 28

#: A group whose title ends with this holds a framework's native pass-through options.
NATIVE_SUFFIX = " native"

#: The module name prefix of a local plugin file (:meth:`plasmid.plugins.PluginManager.load_local`).
LOCAL_PREFIX = "plasmid_local_"

#: Groups the kernel declares without an options class.
KERNEL_GROUPS = frozenset({"general", "providers"})


def short_help(parser: argparse.ArgumentParser, option_classes: Iterable[type[Options]], *,
               first: Iterable[type[Options]] = ()) -> str:
    """The text of ``--help`` for ``parser`` (an :class:`plasmid.config.OptionParser`'s), whose
    typed options were declared by ``option_classes``. The options of the classes ``first`` (a
    command's own: ``plasmid eval``'s ``--checkpoint``) are listed before every other, each class
    under its group's title."""
    from plasmid.options import option_fields

    owner_of: dict[str, str] = {}        # dest -> top-level package of its options class
    for cls in option_classes:
        for field_ in option_fields(cls):
            owner_of[field_.name] = cls.__module__.partition(".")[0]
    groups = [(group.title or "", [a for a in group._group_actions if a.option_strings])
              for group in parser._action_groups]
    by_dest = {a.dest: a for _, actions in groups for a in actions}
    shown: set[int] = set()        # id() of the actions listed so far
    formatter = argparse.HelpFormatter(parser.prog, max_help_position=HELP_POSITION)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    formatter.add_text(parser.description)
    formatter.add_text("Options come from the defaults, then --config FILE (YAML, TOML or JSON; keys are the "
                       "options' Python names: num_rollouts: 2), then the command line (and @ARGS_FILE); the "
                       "command line wins. 'plasmid config show [OPTIONS]' prints the resolved configuration.")

    def section(title: str, actions: list[argparse.Action]) -> None:
        actions = [a for a in actions if id(a) not in shown]
        if not actions:
            return
        shown.update(id(a) for a in actions)
        formatter.start_section(title)
        formatter.add_arguments([with_default(a) for a in actions])
        formatter.end_section()

    section("help", [a for a in parser._actions if a.option_strings and a.default == argparse.SUPPRESS])
    for cls in first:
        section(cls.group or cls.__name__, [by_dest[f.name] for f in option_fields(cls) if f.name in by_dest])
    for title, dests in COMMON:
        section(f"common: {title}", [by_dest[d] for d in dests if d in by_dest])
    natives = [(title, actions) for title, actions in groups if title.endswith(NATIVE_SUFFIX) and actions]
    plain = [(title, actions) for title, actions in groups if not title.endswith(NATIVE_SUFFIX)]
    for title, actions in plain:
        section(f"kernel: {title}", [a for a in actions if owner_of.get(a.dest, "plasmid") == "plasmid"
                                     and (a.dest in owner_of or title in KERNEL_GROUPS)])
    packages: list[str] = []
    for package in owner_of.values():
        if package != "plasmid" and package not in packages:
            packages.append(package)
    headings = _headings(packages)
    for package in packages:
        for title, actions in plain:
            section(f"{headings[package]}: {title}", [a for a in actions if owner_of.get(a.dest) == package])
    for title, actions in plain:
        section(title, actions)
    text = formatter.format_help().rstrip("\n") + "\n"
    if natives:
        text += ("\nnative pass-through options (listed by --help-all, and a plugin's by 'plasmid plugins "
                 "show NAME'):\n")
        text += "".join(f"  {title}: {len(actions)} options {_prefix(actions)}*\n" for title, actions in natives)
    return text


def with_default(action: argparse.Action) -> argparse.Action:
    """A copy of ``action`` as ``--help`` lists it: its help ends with its default when the help
    does not give one, and a value without a metavar is named by its type (``N``, ``X``, ``TEXT``)
    rather than by the destination in capitals, which keeps most flags on one line."""
    copied = copy.copy(action)
    if copied.metavar is None and copied.choices is None and copied.nargs != 0:
        copied.metavar = {int: "N", float: "X"}.get(copied.type, "TEXT")  # type: ignore[call-overload]
    help_text = action.help or ""
    if action.help == argparse.SUPPRESS or action.default == argparse.SUPPRESS or "default" in help_text.lower():
        return copied
    copied.help = f"{help_text} (default: {default_text(action.default).replace('%', '%%')})".strip()
    return copied


def default_text(value: object) -> str:
    """A default as help and the options page show it: ``on``/``off`` for booleans, ``none`` for
    nothing, a list joined with commas."""
    if value is None or value == [] or value == ():
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    return str(value)


def _prefix(actions: list[argparse.Action]) -> str:
    """The longest flag prefix the actions share, cut after a dash (``--megatron-``)."""
    prefix = os.path.commonprefix([a.option_strings[0] for a in actions])
    return prefix[: prefix.rfind("-") + 1] if prefix.rfind("-") > 1 else prefix


def _headings(packages: list[str]) -> dict[str, str]:
    """``plugin NAMES (DISTRIBUTION VERSION)`` of each top-level package, from the installed
    metadata; a package no entry point of group ``plasmid`` names is a shared library."""
    from plasmid.plugins import installed_entry_points

    dists = metadata.packages_distributions()
    plugins: dict[str, list[str]] = {}
    for name, ep in installed_entry_points().items():
        plugins.setdefault(ep.value.partition(".")[0].partition(":")[0], []).append(name)
    headings: dict[str, str] = {}
    for package in packages:
        if package.startswith(LOCAL_PREFIX):    # --plugins ./file.py
            headings[package] = f"plugin {package.removeprefix(LOCAL_PREFIX)} (local file)"
            continue
        dist_names = dists.get(package, [])
        dist = dist_names[0] if dist_names else package
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            version = ""
        label = f"{dist} {version}".strip()
        names = plugins.get(package)
        headings[package] = f"plugin {', '.join(names)} ({label})" if names else f"library {label}"
    return headings


__all__ = ["COMMON", "NATIVE_SUFFIX", "short_help"]
