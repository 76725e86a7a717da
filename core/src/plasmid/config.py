"""Command-line options and the parsed configuration.

The kernel's own options are declared in :mod:`plasmid.options`; plugins add theirs through the
``plasmid_addoption`` hook. Options are grouped (``--help`` shows one section per plugin).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class OptionGroup:
    """A titled section of options; ``addoption`` takes argparse's arguments."""

    def __init__(self, group: argparse._ArgumentGroup, parser: OptionParser) -> None:
        self._group = group
        self._parser = parser

    def addoption(self, *flags: str, **kwargs: Any) -> None:
        self._parser._check_new(flags)
        self._group.add_argument(*flags, **kwargs)


class OptionParser:
    """The parser handed to ``plasmid_addoption``.

    Options are long flags (``--eps-clip``); their value is ``config.option.eps_clip``.
    Declaring a flag twice is an error naming the flag.
    """

    def __init__(self, prog: str = "plasmid train", description: str = "") -> None:
        self._parser = argparse.ArgumentParser(prog=prog, description=description, allow_abbrev=False)
        self._groups: dict[str, OptionGroup] = {}
        self._flags: set[str] = set()

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

    def defaults(self) -> argparse.Namespace:
        """Every option at its default value (what a config built in code starts from)."""
        return self._parser.parse_args([])

    def format_help(self) -> str:
        return self._parser.format_help()


@dataclass
class Config:
    """The run's configuration: every option's value plus what the kernel resolved.

    Plain data, picklable: it is sent to every Ray actor.

    :ivar option: ``argparse.Namespace`` of every option (``config.option.lr``).
    :ivar plugin_lock: the resolved plugin set (see :mod:`plasmid.plugins`), as dicts.
    :ivar run_dir: where metrics, checkpoints and the lock are written.
    """

    option: argparse.Namespace
    plugin_lock: list[dict[str, str]] = field(default_factory=list)
    run_dir: Path = Path("runs/unnamed")

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
