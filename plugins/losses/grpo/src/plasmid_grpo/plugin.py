"""Hook implementations of plasmid-grpo (torch is imported only when the loss is chosen)."""

from __future__ import annotations

from plasmid import hookimpl


@hookimpl
def plasmid_losses(register):
    register("grpo", "plasmid_grpo.loss:GRPOLoss", default=True)
