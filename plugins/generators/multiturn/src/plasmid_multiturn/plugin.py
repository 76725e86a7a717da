"""Hook implementations of plasmid-multiturn."""

from __future__ import annotations

from collections.abc import Callable

from plasmid import hookimpl
from plasmid.config import OptionParser
from plasmid_multiturn.options import MultiTurnOptions
from plasmid_serving.parsers.options import ParserOptions


@hookimpl
def plasmid_addoption(parser: OptionParser) -> None:
    parser.add_options(MultiTurnOptions)
    parser.add_options(ParserOptions)  # --tool-parser, --reasoning-parser (shared with the agent gateway)


@hookimpl
def plasmid_generate_fns(register: Callable[..., None]) -> None:
    register("multiturn", "plasmid_multiturn.generate:MultiTurn")
