"""Hook implementations of plasmid-match."""

from __future__ import annotations

from plasmid import hookimpl


@hookimpl
def plasmid_rewards(register):
    register("exact", "plasmid_match.rewards:ExactMatch", default=True)
    register("normalized", "plasmid_match.rewards:NormalizedMatch")
    register("f1", "plasmid_match.rewards:TokenF1")
