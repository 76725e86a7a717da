"""Hook implementations of plasmid-torchtrain (torch is imported only when the trainer is chosen)."""

from __future__ import annotations

from plasmid import hookimpl
from plasmid.config import OptionParser
from plasmid_torch.trainer_options import TrainerOptions


@hookimpl
def plasmid_addoption(parser: OptionParser) -> None:
    parser.add_options(TrainerOptions)


@hookimpl
def plasmid_trainers(register):
    register("torchtrain", "plasmid_torchtrain.trainer:TorchTrainer", default=True)
