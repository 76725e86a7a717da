"""Hook implementations of plasmid-torchgen: the ``torchgen`` engine and its options, and the ``vision``
generate function (prompts with images, :mod:`plasmid_torchgen.vision`)."""

from __future__ import annotations

from plasmid import hookimpl
from plasmid.config import OptionParser
from plasmid_torch.device_options import DeviceOptions
from plasmid_torchgen.options import TorchgenOptions


@hookimpl
def plasmid_addoption(parser: OptionParser) -> None:
    parser.add_options(TorchgenOptions)
    parser.add_options(DeviceOptions)


@hookimpl
def plasmid_generators(register):
    register("torchgen", "plasmid_torchgen.engine:TorchEngine", default=True)


@hookimpl
def plasmid_generate_fns(register):
    register("vision", "plasmid_torchgen.vision:VisionSingleTurn")
