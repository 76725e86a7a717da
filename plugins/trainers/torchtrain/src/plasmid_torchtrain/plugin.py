"""Hook implementations of plasmid-torchtrain (torch is imported only when the trainer is chosen, or a
``--profile-step`` trace is asked for: :mod:`plasmid_torchtrain.profiling`)."""

from __future__ import annotations

from plasmid import hookimpl
from plasmid.config import OptionParser
from plasmid_torch.device_options import DeviceOptions
from plasmid_torch.trainer_options import TrainerOptions
from plasmid_torchtrain.options import TorchtrainOptions


@hookimpl
def plasmid_addoption(parser: OptionParser) -> None:
    parser.add_options(TrainerOptions)
    parser.add_options(DeviceOptions)
    parser.add_options(TorchtrainOptions)


@hookimpl
def plasmid_trainers(register):
    register("torchtrain", "plasmid_torchtrain.trainer:TorchTrainer", default=True)


@hookimpl
def plasmid_run_start(config, run_dir):
    """``--profile-step``: arm the step's PyTorch profiler trace (:mod:`plasmid_torchtrain.profiling`)."""
    from plasmid_torchtrain import profiling

    profiling.run_start(config, run_dir)


@hookimpl
def plasmid_step_end(step, run_dir):
    from plasmid_torchtrain import profiling

    profiling.step_end(step, run_dir)


@hookimpl
def plasmid_run_end(run_dir):
    from plasmid_torchtrain import profiling

    profiling.run_end(run_dir)
