"""The kernel's start-up as the application's commands run it: ``--config`` files read by
:mod:`plasmid.app.configfile` and ``--help`` rendered by :mod:`plasmid.app.helptext`."""

from __future__ import annotations

from collections.abc import Callable

from plasmid import startup
from plasmid.app import configfile
from plasmid.app.helptext import short_help
from plasmid.config import OptionParser


def start(argv: list[str], prog: str = "plasmid train", *,
          description: str = "Run RL post-training through the loaded plugins.",
          add_options: Callable[[OptionParser], None] | None = None,
          rewards_only: bool = False) -> startup.Startup:
    """:func:`plasmid.startup.start` with the application's file reader and help text."""
    return startup.start(argv, prog, description=description, add_options=add_options, rewards_only=rewards_only,
                         files=configfile, help_text=short_help)


def option_parser(prog: str = "plasmid train", description: str = "") -> OptionParser:
    """An :class:`~plasmid.config.OptionParser` with the application's file reader and help text."""
    return OptionParser(prog, description, files=configfile, help_text=short_help)


__all__ = ["option_parser", "start"]
