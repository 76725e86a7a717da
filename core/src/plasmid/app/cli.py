"""The ``plasmid`` command.

    plasmid train [--config FILE] [OPTIONS]   run RL training (no options: the CPU quickstart)
    plasmid config show [--config FILE] [OPTIONS] [--json]   resolved options, where each came from
    plasmid plugins [--json]           list installed plugins, their providers and status
    plasmid plugins show NAME [--json] one plugin: providers, hooks, options
    plasmid plugins check [--json]     import each plugin in a fresh process; report failures, times
    plasmid score --reward NAME [--label L] < lines   score responses read from stdin (JSON or text lines)
    plasmid new-plugin FAMILY NAME [--dir D]   write a working plugin package (reward, engine, ...) to start
                                       from (from plasmid-scaffold, a package command)
    plasmid model-from-gguf SOURCE OUT_DIR   a GGUF model (a file, or a package that ships one) as a
                                       Hugging Face model directory for --model (from plasmid-gguf)
    plasmid parity --engine E --trainer T --model DIR [--sequences FILE] [--bound B]   engine and trainer
                                       log-probs of the same tokens; beyond the bound, the first layer
                                       where they diverge (from plasmid-parity, a package command)
    plasmid rollout [OPTIONS] [--save-rollouts DIR]   generate and score with the train options, no training
    plasmid replay DIR [OPTIONS]       train on rollouts saved with --save-rollouts, no engine
    plasmid eval --checkpoint DIR | --model DIR [--eval-data NAME=PATH] [--eval-n-samples K]   JSON results
    plasmid --version                  the kernel's and every installed plugin's version

``train``, ``config`` and ``plugins`` are built in; every other command comes from an installed
package: entry points of group ``plasmid.commands`` (:data:`COMMAND_GROUP`), ``name =
"module:function"`` with ``function(argv) -> int``. The ``plasmid`` distribution declares its own
``eval``, ``rollout``, ``replay`` and ``score`` that way (they keep their names over another
package's), plasmid-scaffold its ``new-plugin``; a built-in command keeps its name. A package
command that fails to import is one line naming its distribution.

Every command answers ``--help``. Errors that a user can fix (:class:`plasmid.errors.PlasmidError`,
and a full disk, exceeded quota, read-only or forbidden path: an ``OSError`` with one of
:data:`DISK_ERRORS`, named by its path) print one line and exit 2; ``--debug`` (or ``debug: true`` in a
``--config`` file) adds the traceback.
"""

from __future__ import annotations

import errno
import sys
import traceback
from collections.abc import Callable
from typing import Any

from plasmid.errors import PlasmidError

USAGE = __doc__.split("\n\n")[1]


#: seconds the ``plasmid`` command may take to exit after a second Ctrl-C before it is ended
FORCE_EXIT_SECONDS = 5.0


def entry() -> None:
    """The ``plasmid`` console script: :func:`main` in a process of its own, where a second Ctrl-C
    ends the process within :data:`FORCE_EXIT_SECONDS` whatever hangs (:mod:`plasmid.shutdown`)."""
    from plasmid import shutdown

    shutdown.force_exit_after_second_interrupt(FORCE_EXIT_SECONDS)
    sys.exit(main())


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        extra = [f"    plasmid {name:<30} (from {ep.dist.name if ep.dist else '?'})"
                 for name, ep in sorted(package_commands().items()) if f"plasmid {name} " not in USAGE]
        print("usage:\n" + "\n".join([USAGE, *extra]))
        return 0
    if argv[0] in ("-V", "--version"):
        print(version_text())
        return 0
    command, rest = argv[0], argv[1:]
    commands: dict[str, Callable[[list[str]], int]] = {
        "train": cmd_train, "plugins": cmd_plugins, "config": cmd_config}
    packaged = {name: ep for name, ep in package_commands().items() if name not in commands}
    if command not in commands and command not in packaged:
        from plasmid.errors import did_you_mean

        if command in PACKAGED_COMMANDS:
            dist, requirements = PACKAGED_COMMANDS[command]
            print(f"plasmid: error: 'plasmid {command}' comes with the {dist} package, which is not installed: "
                  f"pip install {dist} ({requirements} installs it)", file=sys.stderr)
            return 2
        known = {*commands, *packaged}
        print(f"plasmid: error: unknown command {command!r}{did_you_mean(command, known)} ('plasmid --help' "
              f"lists the commands)", file=sys.stderr)
        return 2
    try:
        if command in packaged:
            return int(load_command(packaged[command])(rest))
        return commands[command](rest)
    except PlasmidError as exc:
        if debug_requested(rest):
            traceback.print_exc()
        print(f"plasmid: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("plasmid: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        disk = disk_error(exc)
        if disk is None:
            raise
        if debug_requested(rest):
            traceback.print_exc()
        print(f"plasmid: error: {disk}", file=sys.stderr)
        return 2


#: errno -> what it means for the file named, in the one-line report of a storage fault.
DISK_ERRORS = {errno.ENOSPC: "disk full writing {}", errno.EDQUOT: "disk quota exceeded writing {}",
               errno.EROFS: "read-only file system: cannot write {}", errno.EACCES: "permission denied: {}",
               errno.EPERM: "operation not permitted: {}"}


#: Faults that mean the storage itself, reported even when another error followed them (a
#: shutdown failing on the same full disk); a forbidden path only when it is the error raised.
STORAGE_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})


def disk_error(exc: BaseException) -> str | None:
    """The one-line report of a storage fault that ``exc`` is (any of :data:`DISK_ERRORS`) or
    followed (one of :data:`STORAGE_FULL` in its ``__cause__``/``__context__`` chain), or ``None``."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        codes = DISK_ERRORS if current is exc else STORAGE_FULL
        if isinstance(current, OSError) and current.errno is not None and current.errno in codes:
            where = current.filename if current.filename is not None else "(no path given)"
            return DISK_ERRORS[current.errno].format(where) + f" ({current.strerror or current})"
        current = current.__cause__ or current.__context__
    return None


def cmd_train(argv: list[str]) -> int:
    import asyncio

    from plasmid.app.run import run_training

    asyncio.run(run_training(argv))
    return 0


def cmd_plugins(argv: list[str]) -> int:
    from plasmid.app.introspect import plugins_command

    return plugins_command(argv)


def cmd_config(argv: list[str]) -> int:
    from plasmid.app.show_config import config_command

    return config_command(argv)


def version_text() -> str:
    """``plasmid --version``: the kernel's version, then every installed plugin (entry point of
    group ``plasmid``) as name, distribution and version; nothing is imported."""
    import plasmid
    from plasmid.plugins import installed_entry_points

    lines = [f"plasmid {plasmid.__version__} (plugin API {plasmid.API_VERSION})"]
    for name, ep in sorted(installed_entry_points().items()):
        dist = ep.dist.name if ep.dist else "?"
        lines.append(f"  {name:<16} {dist} {ep.dist.version if ep.dist else ''}".rstrip())
    return "\n".join(lines)


#: Entry-point group of commands from installed packages (``plasmid new-plugin``: plasmid-scaffold).
COMMAND_GROUP = "plasmid.commands"

#: Package commands the README names -> the distribution that provides each and the requirements
#: file that installs it (for the hint when it is not installed).
PACKAGED_COMMANDS = {"new-plugin": ("plasmid-scaffold", "requirements/embedded.txt"),
                     "parity": ("plasmid-parity", "requirements/embedded.txt"),
                     "model-from-gguf": ("plasmid-gguf", "requirements/realmodel.txt")}


def package_commands() -> dict[str, Any]:
    """Name -> entry point of every command of group :data:`COMMAND_GROUP` (nothing imported); a
    name the ``plasmid`` distribution declares is its own, whichever package declares it too."""
    from importlib.metadata import entry_points

    def own(ep: Any) -> bool:
        return ep.dist is not None and ep.dist.name == "plasmid"

    return {ep.name: ep for ep in sorted(entry_points(group=COMMAND_GROUP), key=own)}


def load_command(ep: Any) -> Callable[[list[str]], int]:
    """The function of package command ``ep``; a failing import or a target that is not callable
    is a :class:`plasmid.errors.PluginError` naming the command and its distribution."""
    from plasmid.errors import PluginError

    dist = f"{ep.dist.name} {ep.dist.version}" if getattr(ep, "dist", None) else "?"
    try:
        function = ep.load()
    except Exception as exc:
        raise PluginError(f"command '{ep.name}' ({dist}, {ep.value}) failed to import: "
                          f"{type(exc).__name__}: {exc}") from exc
    if not callable(function):
        raise PluginError(f"command '{ep.name}' ({dist}): {ep.value} is not a function of argv")
    command: Callable[[list[str]], int] = function
    return command


def debug_requested(argv: list[str]) -> bool:
    """``--debug`` on the command line, in an ``@file`` or as ``debug: true`` in a ``--config`` file
    (:func:`plasmid.app.configfile.debug_requested`)."""
    from plasmid.app.configfile import debug_requested as requested

    return requested(argv)


if __name__ == "__main__":
    entry()
