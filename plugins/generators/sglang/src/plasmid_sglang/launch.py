"""Entry point of a launched SGLang server: ``python -m plasmid_sglang.launch SPEC.json``.

Runs in the server's own process (the only plasmid code there). It does what
``python -m sglang.launch_server`` does, except that the settings come from a JSON file instead
of a command line, so that every ``ServerArgs`` field can be given, typed, including booleans
that SGLang's command line can only switch on:

``SPEC.json`` holds ``{"values": {field: value}, "texts": {field: "string"}}``: ``values`` are
set on the parsed arguments as they are; ``texts`` are given to SGLang's own command-line parser
as ``--<field> <words...>`` (for fields that SGLang parses itself: lists, JSON, sizes).
Written by :func:`plasmid_sglang.server.write_spec`.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from typing import Any


def server_args_from_spec(spec: dict[str, Any]) -> Any:
    """SGLang's ``ServerArgs`` for ``spec`` (see the module docstring); imports sglang."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="plasmid_sglang.launch")
    ServerArgs.add_cli_args(parser)
    flags = {action.dest: action.option_strings[0] for action in parser._actions if action.option_strings}
    argv = ["--model-path", str(spec["values"]["model_path"])]
    for name, text in spec.get("texts", {}).items():
        if name not in flags:
            raise SystemExit(f"plasmid_sglang.launch: --sglang-{name.replace('_', '-')} has no command-line form in "
                             f"this SGLang, so a text value cannot be parsed; it was given {text!r}")
        argv += [flags[name], *shlex.split(text)]
    namespace = parser.parse_args(argv)
    for name, value in spec["values"].items():
        setattr(namespace, name, value)
    return ServerArgs.from_cli_args(namespace)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise SystemExit("usage: python -m plasmid_sglang.launch SPEC.json")
    with open(argv[0], encoding="utf-8") as handle:
        spec = json.load(handle)

    from sglang.launch_server import run_server
    from sglang.srt.plugins import load_plugins
    from sglang.srt.utils import kill_process_tree

    load_plugins()
    server_args = server_args_from_spec(spec)
    try:
        run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


if __name__ == "__main__":
    main()
