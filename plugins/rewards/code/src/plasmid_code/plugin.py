"""Hook implementations of plasmid-code."""

from __future__ import annotations

from collections.abc import Callable

from plasmid import hookimpl
from plasmid.config import OptionParser
from plasmid_code.options import CodeOptions


@hookimpl
def plasmid_addoption(parser: OptionParser) -> None:
    parser.add_options(CodeOptions)


@hookimpl
def plasmid_rewards(register: Callable[..., None]) -> None:
    register("code", "plasmid_code.reward:CodeReward")
