"""Command-line options and the parsed configuration.

Options are declared as typed classes (:mod:`plasmid.options`) through the ``plasmid_addoption``
hook; the kernel's own are in :mod:`plasmid.kernel_options`. Options are grouped (``--help``
shows one section per group).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

if TYPE_CHECKING:
    from plasmid.options import Options

OptionsT = TypeVar("OptionsT", bound="Options")


class OptionGroup:
    """A titled section of options; ``addoption`` takes argparse's arguments."""

    def __init__(self, group: argparse._ArgumentGroup, parser: OptionParser) -> None:
        self._group = group
        self._parser = parser

    def addoption(self, *flags: str, **kwargs: Any) -> None:
        self._parser._check_new(flags)
        self._group.add_argument(*flags, **kwargs)


class _ArgumentParser(argparse.ArgumentParser):
    """argparse, with errors as one-line :class:`plasmid.errors.UsageError` instead of the usage
    text and ``SystemExit``; an unknown flag gets a "did you mean"."""

    def error(self, message: str) -> NoReturn:
        from plasmid.errors import UsageError
        from plasmid.plugins import did_you_mean

        if message.startswith("unrecognized arguments: "):
            unknown = message.removeprefix("unrecognized arguments: ").split()
            known = [flag for action in self._actions for flag in action.option_strings]
            flag = next((word for word in unknown if word.startswith("--")), unknown[0])
            hint = did_you_mean(flag.partition("=")[0], known)
            raise UsageError(f"unknown option {flag}{hint} ('{self.prog} --help' lists the options)")
        raise UsageError(f"{message} ('{self.prog} --help' lists the options)")


class OptionParser:
    """The parser handed to ``plasmid_addoption``.

    Options are long flags (``--eps-clip``); their value is ``config.option.eps_clip``.
    Declaring a flag twice is an error naming the flag.
    """

    def __init__(self, prog: str = "plasmid train", description: str = "") -> None:
        self._parser = _ArgumentParser(prog=prog, description=description, allow_abbrev=False)
        self._groups: dict[str, OptionGroup] = {}
        self._flags: set[str] = set()
        #: the :class:`plasmid.options.Options` classes declared, in order (each once)
        self.option_classes: list[type[Options]] = []

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
                from plasmid.errors import PluginError

                raise PluginError(f"option {flag} is declared twice (by two plugins, or twice by one)")
            self._flags.add(flag)

    def parse(self, args: list[str]) -> argparse.Namespace:
        return self._parser.parse_args(args)

    def given(self, args: list[str]) -> frozenset[str]:
        """The destinations (``lr``, ``eps_clip``) that ``args`` sets explicitly: parsed once more
        with every default suppressed, so what remains was on the command line."""
        actions = [a for a in self._parser._actions if a.option_strings]
        saved = [a.default for a in actions]
        try:
            for action in actions:
                action.default = argparse.SUPPRESS
            return frozenset(vars(self._parser.parse_args(args)))
        finally:
            for action, default in zip(actions, saved, strict=True):
                action.default = default

    def defaults(self) -> argparse.Namespace:
        """Every option at its default value (what a config built in code starts from)."""
        return self._parser.parse_args([])

    def format_help(self) -> str:
        return self._parser.format_help()


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
