"""Hook implementations of plasmid-match."""

from __future__ import annotations

from plasmid import hookimpl


@hookimpl
def plasmid_addoption(parser):
    group = parser.getgroup("match", "the match rewards")
    group.addoption("--choice-letters", default="ABCDE",
                    help="the option letters of the 'choice' reward, in order (index 0 is the first)")


@hookimpl
def plasmid_rewards(register):
    register("exact", "plasmid_match.rewards:ExactMatch", default=True)
    register("normalized", "plasmid_match.rewards:NormalizedMatch")
    register("f1", "plasmid_match.rewards:TokenF1")
    register("choice", "plasmid_match.rewards:ChoiceReward")
