"""Hook implementations of plasmid-dynamic."""

from __future__ import annotations

from collections.abc import Callable

from plasmid import hookimpl
from plasmid.config import OptionParser
from plasmid_dynamic.options import ZeroStdOptions


@hookimpl
def plasmid_addoption(parser: OptionParser) -> None:
    parser.add_options(ZeroStdOptions)


@hookimpl
def plasmid_filters(register: Callable[..., None]) -> None:
    register("zero-std", "plasmid_dynamic.zero_std:ZeroStdFilter")
