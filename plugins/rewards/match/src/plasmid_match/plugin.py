"""Hook implementations of plasmid-match."""

from __future__ import annotations

from collections.abc import Callable

from plasmid import hookimpl
from plasmid.config import OptionParser
from plasmid_match.options import MatchOptions


@hookimpl
def plasmid_addoption(parser: OptionParser) -> None:
    parser.add_options(MatchOptions)


@hookimpl
def plasmid_rewards(register: Callable[..., None]) -> None:
    register("exact", "plasmid_match.rewards:ExactMatch", default=True)
    register("normalized", "plasmid_match.rewards:NormalizedMatch")
    register("f1", "plasmid_match.rewards:TokenF1")
    register("choice", "plasmid_match.rewards:ChoiceReward")
