"""Hook implementations of plasmid-multiturn."""

from __future__ import annotations

from collections.abc import Callable

from plasmid import hookimpl
from plasmid.config import OptionParser
from plasmid_multiturn.options import MultiTurnOptions


@hookimpl
def plasmid_addoption(parser: OptionParser) -> None:
    parser.add_options(MultiTurnOptions)


@hookimpl
def plasmid_generate_fns(register: Callable[..., None]) -> None:
    register("multiturn", "plasmid_multiturn.generate:MultiTurn")
