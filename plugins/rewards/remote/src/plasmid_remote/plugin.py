"""Hook implementations of plasmid-remote."""

from __future__ import annotations

from collections.abc import Callable

from plasmid import hookimpl
from plasmid.config import OptionParser
from plasmid_remote.options import RemoteOptions


@hookimpl
def plasmid_addoption(parser: OptionParser) -> None:
    parser.add_options(RemoteOptions)


@hookimpl
def plasmid_rewards(register: Callable[..., None]) -> None:
    register("remote", "plasmid_remote.reward:RemoteReward")
