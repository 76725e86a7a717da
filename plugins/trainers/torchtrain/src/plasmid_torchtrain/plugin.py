"""Hook implementations of plasmid-torchtrain (torch is imported only when the trainer is chosen)."""

from __future__ import annotations

from plasmid import hookimpl


@hookimpl
def plasmid_trainers(register):
    register("torchtrain", "plasmid_torchtrain.trainer:TorchTrainer", default=True)
