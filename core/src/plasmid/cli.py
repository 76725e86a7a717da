"""The ``plasmid`` command.

    plasmid train [OPTIONS]            run RL training (no options: the CPU quickstart)
    plasmid plugins [--json]           list installed plugins, their providers and status
    plasmid plugins show NAME [--json] one plugin: providers, hooks, options
    plasmid plugins check [--json]     import each plugin in a fresh process; report failures, times
    plasmid score --reward NAME [--label L] < lines   score responses read from stdin (JSON or text lines)
    plasmid new-plugin reward NAME [--dir D]   write a working third-party reward package to start from

Errors that a user can fix (:class:`plasmid.errors.PlasmidError`) print one message and exit 2;
``--debug`` adds the traceback.
"""

from __future__ import annotations

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
