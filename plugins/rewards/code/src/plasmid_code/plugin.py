"""Hook implementations of plasmid-code: the ``code`` reward and the ``python`` tool, which share
the sandbox."""

from __future__ import annotations

from collections.abc import Callable

from plasmid import hookimpl
from plasmid.config import OptionParser
from plasmid_code.options import CodeOptions, PythonToolOptions


@hookimpl
def plasmid_addoption(parser: OptionParser) -> None:
    parser.add_options(CodeOptions)
    parser.add_options(PythonToolOptions)


@hookimpl
def plasmid_rewards(register: Callable[..., None]) -> None:
    register("code", "plasmid_code.reward:CodeReward")


@hookimpl
def plasmid_tools(register: Callable[..., None]) -> None:
    register("python", "plasmid_code.tool:PythonTool")
