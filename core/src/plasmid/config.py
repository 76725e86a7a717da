"""Command-line options and the parsed configuration.

Options are declared as typed classes (:mod:`plasmid.options`) through the ``plasmid_addoption``
hook; the kernel's own are in :mod:`plasmid.kernel_options`. Options are grouped (``--help``
shows one section per group).

Where values come from, lowest precedence first: the declared defaults, then ``--config FILE``
(when the parser is given a :class:`ConfigFiles` reader: the application's is
:mod:`plasmid.app.configfile`, YAML, TOML or JSON whose keys are the destinations), then the command
line (which may include ``@args.txt``: one or more arguments per line, shell quoting, ``#``
comments). A recipe's defaults hook changes only what neither the file nor the command line set.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TypeVar

from plasmid.errors import PlasmidError, PluginError, UsageError, did_you_mean

if TYPE_CHECKING:
    from plasmid.options import Options

OptionsT = TypeVar("OptionsT", bound="Options")


class ConfigFiles(Protocol):
    """Reads ``--config`` files for an :class:`OptionParser` (the module
    :mod:`plasmid.app.configfile` is the application's)."""

    def plugins_in(self, paths: list[str]) -> str | None:
        """The plugin selection (``plugins:``) the files ``paths`` make, read before plugins load."""

    def values(self, path: str, options: set[str], sections: set[str]) -> dict[str, Any]:
        """``{destination: value}`` of file ``path``, whose keys must be among ``options`` or
        under a section among ``sections``."""


#: What ``--help`` prints, from argparse's parser and the declared options classes (the
#: application's: :func:`plasmid.app.helptext.short_help`).
HelpText = Callable[[argparse.ArgumentParser, "list[type[Options]]"], str]


class OptionGroup:
    """A titled section of options; ``addoption`` takes argparse's arguments."""

    def __init__(self, group: argparse._ArgumentGroup, parser: OptionParser) -> None:
        self._group = group
        self._parser = parser

    def addoption(self, *flags: str, **kwargs: Any) -> None:
        """argparse's ``add_argument``; a ``%`` in ``help`` is text (argparse would read it as a format
        directive and fail to print ``--help``: "~20% slower")."""
        self._parser._check_new(flags)
        if isinstance(kwargs.get("help"), str):
            kwargs["help"] = kwargs["help"].replace("%", "%%")
        self._group.add_argument(*flags, **kwargs)


def help_of(action: argparse.Action) -> str:
    """An option's help as plain text: argparse's help strings are ``%`` templates, so
    :meth:`OptionGroup.addoption` escapes a literal ``%``; readers of ``action.help`` outside a
    help formatter (``plasmid plugins show``, the options page) undo that here."""
    return (action.help or "").replace("%%", "%")


class ArgumentParser(argparse.ArgumentParser):
    """argparse, with errors as one-line :class:`plasmid.errors.UsageError` instead of the usage
    text and ``SystemExit``; an unknown flag gets a "did you mean". Every ``plasmid`` command
    parses with it, so bad input to any command is one line (exit 2)."""

    def convert_arg_line_to_args(self, arg_line: str) -> list[str]:
        """A line of an ``@args.txt`` file: shell words (``--lr 1e-5`` is two arguments), ``#``
        starts a comment."""
        try:
            return shlex.split(arg_line, comments=True)
        except ValueError as exc:
            raise UsageError(f"argument file line {arg_line.strip()!r}: {exc}") from None

    #: builds what ``--help`` prints instead of argparse's full listing (``None``: the full one)
    short_help: Callable[[], str] | None = None

    def format_help(self) -> str:
        return self.short_help() if self.short_help is not None else super().format_help()

    def error(self, message: str) -> NoReturn:
        if message.startswith("[Errno"):   # an @file that cannot be read
            raise UsageError(f"cannot read the argument file: {message}")
        if message.startswith("unrecognized arguments: "):
            unknown = message.removeprefix("unrecognized arguments: ").split()
            known = [flag for action in self._actions for flag in action.option_strings]
            flag = next((word for word in unknown if word.startswith("--")), unknown[0])
            hint = did_you_mean(flag.partition("=")[0], known)
            raise UsageError(f"unknown option {flag}{hint} ('{self.prog} --help' lists the options)")
        raise UsageError(f"{message} ('{self.prog} --help' lists the options)")


_ArgumentParser = ArgumentParser   # the name before it was public


class OptionParser:
    """The parser handed to ``plasmid_addoption``.

    Options are long flags (``--eps-clip``); their value is ``config.option.eps_clip``.
    Declaring a flag twice is an error naming the flag. ``--config FILE`` exists when ``files``
    reads them; ``--help`` prints ``help_text``'s text (else argparse's full listing).
    """

    def __init__(self, prog: str = "plasmid train", description: str = "", *, files: ConfigFiles | None = None,
                 help_text: HelpText | None = None) -> None:
        self._parser = ArgumentParser(prog=prog, description=description, allow_abbrev=False,
                                      fromfile_prefix_chars="@", usage=USAGE)
        self.files, self.help_text = files, help_text
        if help_text is not None:
            self._parser.short_help = self.format_short_help
        self._parser.add_argument("--help-all", action=_HelpAll, help="every option, the native pass-through "
                                  "ones included, then exit")
        self._groups: dict[str, OptionGroup] = {}
        self._flags: set[str] = set()
        #: the :class:`plasmid.options.Options` classes declared, in order (each once)
        self.option_classes: list[type[Options]] = []
        #: names a ``--config`` file's section may have besides the option groups and the
        #: installed plugins' names
        self.sections: set[str] = set()
        if files is None:
            self.getgroup("general")
            return
        self.getgroup("general").addoption(
            CONFIG_FLAG, dest=CONFIG_DEST, action="append", default=None, metavar="FILE",
            help="read options from a YAML, TOML or JSON file (keys: the options' Python names, "
                 "num_rollouts: 2; a run's config.json works); flags given here override it; "
                 "repeatable, later files override earlier ones")

    def add_options(self, cls: type[Options]) -> None:
        """Declare every field of ``cls`` as a flag in its group. Declaring one class again (two
        plugins sharing a family's options) does nothing; another class with the same flag is an
        error naming the flag."""
        from plasmid.options import option_fields

        if cls in self.option_classes:
            return
        group = self.getgroup(cls.group, cls.description)
        for field_ in option_fields(cls):
            group.addoption(field_.flag, **field_.argparse_kwargs())
        self.option_classes.append(cls)

    def snapshot(self) -> Callable[[], None]:
        """A function that removes every option declared after this call (their groups stay)."""
        parser, flags, classes = self._parser, set(self._flags), list(self.option_classes)
        count = len(parser._actions)

        def undo() -> None:
            for action in parser._actions[count:]:
                action.container._remove_action(action)  # type: ignore[attr-defined]
                for flag in action.option_strings:
                    del parser._option_string_actions[flag]
            self._flags, self.option_classes = flags, classes
        return undo

    def getgroup(self, name: str, description: str = "") -> OptionGroup:
        """The group called ``name``, created on first use."""
        if name not in self._groups:
            self._groups[name] = OptionGroup(self._parser.add_argument_group(name, description), self)
        return self._groups[name]

    def addoption(self, *flags: str, **kwargs: Any) -> None:
        """Add an option to the general group."""
        self.getgroup("general").addoption(*flags, **kwargs)

    def _check_new(self, flags: tuple[str, ...]) -> None:
        for flag in flags:
            if flag in self._flags:
                raise PluginError(f"option {flag} is declared twice (by two plugins, or twice by one)")
            self._flags.add(flag)

    def parse(self, args: list[str]) -> argparse.Namespace:
        """Every option's value: the defaults, overridden by the ``--config`` files' values,
        overridden by ``args`` (a repeatable option given on the command line replaces the
        file's list). A bad value in a file is a one-line ``UsageError`` naming the file and key."""
        if HELP_FLAGS.intersection(args):
            return self._parser.parse_args(args)    # prints the help (with the real defaults), exits
        flags = self._given_flags(args)
        file_args = self._file_arguments(args, flags)
        namespace = self._parser.parse_args(file_args + args)
        vars(namespace).pop(CONFIG_DEST, None)
        return namespace

    def given(self, args: list[str]) -> frozenset[str]:
        """The destinations (``lr``, ``eps_clip``) that ``args`` sets explicitly, on the command
        line or in a ``--config`` file (a key whose value is ``null`` is not set)."""
        return frozenset(self.sources(args))

    def sources(self, args: list[str]) -> dict[str, str]:
        """``{destination: "flag" | "file"}`` of every option ``args`` sets (the command line
        wins over a file); what is missing is at its default."""
        flags = self._given_flags(args)
        found = {name: "file" for name, value in self.file_values(args).items() if value is not None}
        found.update({name: "flag" for name in flags})
        return found

    def _given_flags(self, args: list[str]) -> frozenset[str]:
        """The destinations set on the command line itself: ``args`` parsed once more with every
        default suppressed, so what remains was given."""
        actions = [a for a in self._parser._actions if a.option_strings]
        saved = [a.default for a in actions]
        try:
            for action in actions:
                action.default = argparse.SUPPRESS
            return frozenset(vars(self._parser.parse_args(args))) - {CONFIG_DEST}
        finally:
            for action, default in zip(actions, saved, strict=True):
                action.default = default

    def config_files(self, args: list[str]) -> list[str]:
        """The ``--config`` files named in ``args`` (``@files`` included), in order."""
        if self.files is None:
            return []
        early = ArgumentParser(add_help=False, allow_abbrev=False, fromfile_prefix_chars="@")
        early.add_argument(CONFIG_FLAG, dest=CONFIG_DEST, action="append", default=[])
        known, _ = early.parse_known_args(args)
        return list(known.config)

    def file_values(self, args: list[str]) -> dict[str, Any]:
        """``{destination: value}`` of the ``--config`` files in ``args`` (a later file overrides
        an earlier one); unknown keys and sections are a ``UsageError`` with "did you mean"."""
        options, sections = self.destinations(), set(self._groups) | self.sections
        values: dict[str, Any] = {}
        for path in self.config_files(args):
            assert self.files is not None   # config_files found none without a reader
            values.update(self.files.values(path, options, sections))
        return values

    def destinations(self) -> set[str]:
        """The destination of every declared option (``--config`` and ``--help`` aside)."""
        return {a.dest for a in self._parser._actions
                if a.option_strings and a.dest not in (CONFIG_DEST, argparse.SUPPRESS, "help", "help_all")}

    def _file_arguments(self, args: list[str], flags: frozenset[str]) -> list[str]:
        """The files' values as command-line arguments, checked by parsing them alone (a bad one
        is reported with its file and key)."""
        files = self.config_files(args)
        if not files:
            return []
        by_dest = {a.dest: a for a in self._parser._actions if a.option_strings}
        where = ", ".join(files)
        words: dict[str, list[str]] = {}
        for name, value in self.file_values(args).items():
            action = by_dest[name]
            if value is None or (name in flags and isinstance(action, argparse._AppendAction)):
                continue
            words[name] = _as_arguments(action, value, f"--config {where}: {name}")
        out = [word for group in words.values() for word in group]
        try:
            self._parser.parse_args(out)
        except PlasmidError:
            for name, group in words.items():   # find the key at fault
                try:
                    self._parser.parse_args(group)
                except PlasmidError as exc:
                    raise UsageError(f"--config {where}: {name}: {exc}".removesuffix(
                        f" ('{self._parser.prog} --help' lists the options)")) from None
            raise
        return out

    def defaults(self) -> argparse.Namespace:
        """Every option at its default value (what a config built in code starts from)."""
        namespace = self._parser.parse_args([])
        vars(namespace).pop(CONFIG_DEST, None)
        return namespace

    def format_help(self) -> str:
        """Every option, group by group, as argparse lists them (``--help-all``)."""
        return argparse.ArgumentParser.format_help(self._parser)

    def format_short_help(self) -> str:
        """What ``--help`` prints: the ``help_text`` renderer's text (the application's lists the
        common options first, then the kernel's, then each plugin's), else :meth:`format_help`."""
        if self.help_text is None:
            return self.format_help()
        return self.help_text(self._parser, self.option_classes)


#: The flag that reads a configuration file, and its destination (removed from the parsed values).
CONFIG_FLAG, CONFIG_DEST = "--config", "config"

#: The flags that print a help text and exit.
HELP_FLAGS = frozenset({"-h", "--help", "--help-all"})

#: The usage line of ``plasmid train`` (the options are too many to list there).
USAGE = "%(prog)s [--config FILE] [@ARGS_FILE] [OPTIONS]"


class _HelpAll(argparse.Action):
    """``--help-all``: the full listing (argparse's), then exit 0."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, default: Any = argparse.SUPPRESS,
                 help: str | None = None) -> None:
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        parser._print_message(argparse.ArgumentParser.format_help(parser), sys.stdout)
        parser.exit()


def _as_arguments(action: argparse.Action, value: Any, where: str) -> list[str]:
    """Command-line words that set ``action`` to ``value`` (a file's value: YAML/TOML/JSON types).
    ``UsageError`` (prefixed with ``where``) when the value's shape cannot be one."""
    flag = action.option_strings[0]
    if isinstance(action, (argparse._StoreTrueAction, argparse.BooleanOptionalAction)):
        if not isinstance(value, bool):
            raise UsageError(f"{where}: expected true or false, got {value!r}")
        if isinstance(action, argparse.BooleanOptionalAction):
            return [flag] if value else ["--no-" + flag[2:]]
        return [flag] if value else []
    if isinstance(action, argparse._AppendAction):
        items = value if isinstance(value, list) else [value]
        return [f"{flag}={_text(item, where)}" for item in items]
    if isinstance(value, (list, dict)):
        if action.type not in (None, str):
            raise UsageError(f"{where}: expected one value, got {type(value).__name__} {value!r}")
        return [f"{flag}={json.dumps(value)}"]
    return [f"{flag}={_text(value, where)}"]


def _text(value: Any, where: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict)):
        raise UsageError(f"{where}: expected a single value in the list, got {value!r}")
    return repr(value) if isinstance(value, float) else str(value)


@dataclass
class Config:
    """The run's configuration: every option's value plus what the kernel resolved.

    Plain data, picklable: it is sent to every Ray actor.

    Providers read their typed options with ``MyOptions.of(config)`` (:mod:`plasmid.options`);
    ``option`` is the raw store those are read from.

    :ivar option: ``argparse.Namespace`` of every option's raw value (``config.option.lr``).
    :ivar plugin_lock: the resolved plugin set (see :mod:`plasmid.plugins`), as dicts.
    :ivar run_dir: where metrics, checkpoints and the lock are written.
    :ivar given: the options the user set (on the command line, or as keywords of
        :func:`plasmid.testing.make_config`); a recipe changes only the others.
    """

    option: argparse.Namespace
    plugin_lock: list[dict[str, str]] = field(default_factory=list)
    run_dir: Path = Path("runs/unnamed")
    given: frozenset[str] = frozenset()

    def options(self, cls: type[OptionsT]) -> OptionsT:
        """``cls.of(self)``: the typed, checked values of one options class."""
        return cls.of(self)

    def is_given(self, name: str) -> bool:
        """Whether the user set option ``name`` (``"lr"``), rather than leaving its default."""
        return name in self.given

    def set_default(self, name: str, value: Any) -> bool:
        """Set option ``name`` to ``value`` unless the user gave it (recipes); whether it was set."""
        if self.is_given(name):
            return False
        setattr(self.option, name, value)
        return True

    def snapshot(self) -> Callable[[], None]:
        """A function that puts every option's value back as it is now."""
        saved = dict(vars(self.option))
        return lambda: setattr(self, "option", argparse.Namespace(**saved))

    def getoption(self, name: str, default: Any = None) -> Any:
        """The value of option ``name`` (``"eps_clip"`` or ``"--eps-clip"``), or ``default``."""
        return getattr(self.option, name.lstrip("-").replace("-", "_"), default)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly view (paths as strings; unserialisable values by ``repr``)."""
        options = {}
        for key, value in sorted(vars(self.option).items()):
            try:
                json.dumps(value)
                options[key] = value
            except TypeError:
                options[key] = str(value) if isinstance(value, Path) else repr(value)
        return {"option": options, "plugin_lock": self.plugin_lock, "run_dir": str(self.run_dir)}
