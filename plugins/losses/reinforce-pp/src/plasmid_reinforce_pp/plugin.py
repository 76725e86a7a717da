"""Hook implementations of plasmid-reinforce-pp (torch is imported only when a loss is chosen)."""

from __future__ import annotations

from plasmid import hookimpl


@hookimpl
def plasmid_losses(register):
    register("reinforce++", "plasmid_reinforce_pp.loss:ReinforcePlusPlusLoss")
    register("reinforce++-baseline", "plasmid_reinforce_pp.loss:ReinforcePlusPlusBaselineLoss")
