"""The kernel's start-up as the application's commands run it: ``--config`` files read by
:mod:`plasmid.app.configfile` and ``--help`` rendered by :mod:`plasmid.app.helptext`."""

from __future__ import annotations

import functools
from collections.abc import Callable

from plasmid import startup
from plasmid.app import configfile
from plasmid.app.helptext import short_help
from plasmid.app.native_hint import install_hint
from plasmid.app.runconfig import RunConfigFiles
from plasmid.app.runlock import used_lock
from plasmid.config import ConfigFiles, OptionParser
from plasmid.errors import UsageError
from plasmid.options import Options


def start(argv: list[str], prog: str = "plasmid train", *,
          description: str = "Run RL post-training through the loaded plugins.",
          add_options: Callable[[OptionParser], None] | None = None,
          rewards_only: bool = False, own_options: tuple[type[Options], ...] = (),
          run_configs: bool = False) -> startup.Startup:
    """:func:`plasmid.startup.start` with the application's file reader and help text.

    :param own_options: the command's own options classes, declared after the plugins' and
        listed first by ``--help``.
    :param run_configs: read a run's ``config.json`` as ``--config`` leniently
        (:class:`plasmid.app.runconfig.RunConfigFiles`: ``plasmid eval``, ``score``, ``rollout``).
    """
    def add_all(parser: OptionParser) -> None:
        if add_options is not None:
            add_options(parser)
        for cls in own_options:
            parser.add_options(cls)

    files: ConfigFiles = configfile.reader(argv)
    if run_configs:
        files = RunConfigFiles(files)
    try:
        started = startup.start(argv, prog, description=description, add_options=add_all,
                                rewards_only=rewards_only, files=files,
                                help_text=functools.partial(short_help, first=own_options))
    except UsageError as exc:   # an unknown --sglang-* option: name what to install (plasmid.app.native_hint)
        hint = install_hint(str(exc))
        if hint is None:
            raise
        raise UsageError(hint) from None
    started.config.plugin_lock = used_lock(started)   # what the run uses, for its lock and --resume
    return started


def option_parser(prog: str = "plasmid train", description: str = "") -> OptionParser:
    """An :class:`~plasmid.config.OptionParser` with the application's file reader and help text."""
    return OptionParser(prog, description, files=configfile, help_text=short_help)


__all__ = ["option_parser", "start"]
