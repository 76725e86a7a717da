"""The ``plasmid`` command.

    plasmid train [OPTIONS]            run RL training (no options: the CPU quickstart)
    plasmid plugins [--json]           list installed plugins, their providers and status
    plasmid plugins show NAME [--json] one plugin: providers, hooks, options
    plasmid plugins check [--json]     import each plugin in a fresh process; report failures, times
    plasmid score --reward NAME [--label L] < lines   score responses read from stdin (JSON or text lines)
    plasmid new-plugin reward NAME [--dir D]   write a working third-party reward package to start from

Errors that a user can fix (:class:`plasmid.errors.PlasmidError`, and a full disk, exceeded quota,
read-only or forbidden path: an ``OSError`` with one of :data:`DISK_ERRORS`, named by its path)
print one message and exit 2; ``--debug`` adds the traceback.
"""

from __future__ import annotations

import errno
import sys
import traceback

from plasmid.errors import PlasmidError

USAGE = __doc__.split("\n\n")[1]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage:\n" + USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    commands = {"train": cmd_train, "plugins": cmd_plugins, "score": cmd_score, "new-plugin": cmd_new_plugin}
    if command not in commands:
        print(f"plasmid: error: unknown command {command!r}\nusage:\n{USAGE}", file=sys.stderr)
        return 2
    try:
        return commands[command](rest)
    except PlasmidError as exc:
        if "--debug" in rest:
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
        if "--debug" in rest:
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

    from plasmid.run import run_training

    asyncio.run(run_training(argv))
    return 0


def cmd_plugins(argv: list[str]) -> int:
    from plasmid.introspect import plugins_command

    return plugins_command(argv)


def cmd_score(argv: list[str]) -> int:
    from plasmid.score import score_command

    return score_command(argv)


def cmd_new_plugin(argv: list[str]) -> int:
    from plasmid.scaffold import new_plugin_command

    return new_plugin_command(argv)


if __name__ == "__main__":
    sys.exit(main())
