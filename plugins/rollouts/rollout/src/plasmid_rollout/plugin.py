"""Hook implementations of plasmid-rollout."""

from __future__ import annotations

from collections.abc import Callable

from plasmid import hookimpl
from plasmid.config import OptionParser
from plasmid_rollout.options import RolloutDriverOptions


@hookimpl
def plasmid_rollouts(register: Callable[..., None]) -> None:
    register("rollout", "plasmid_rollout.driver:AsyncRolloutDriver", default=True)


@hookimpl
def plasmid_addoption(parser: OptionParser) -> None:
    parser.add_options(RolloutDriverOptions)
