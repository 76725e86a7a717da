"""Hook implementations of plasmid-megatron.

Neither torch nor megatron is imported here: the trainer is registered as a ``"module:attr"``
string, and the ``--megatron-*`` options are read from megatron-core's source files without
importing it (see :mod:`plasmid_megatron.native_options`).
"""

from __future__ import annotations

from plasmid import hookimpl
from plasmid.config import Config, OptionParser
from plasmid_megatron.native_options import native_fields
from plasmid_megatron.options import MegatronOptions
from plasmid_serving.native_options import add_options
from plasmid_torch.trainer_options import TrainerOptions


@hookimpl
def plasmid_addoption(parser: OptionParser) -> None:
    parser.add_options(TrainerOptions)
    parser.add_options(MegatronOptions)
    native = parser.getgroup("megatron native", "megatron-core config fields, generated from the installed "
                             "version (TransformerConfig, OptimizerConfig, DistributedDataParallelConfig); "
                             "unset means megatron's default")
    add_options(native, native_fields())


@hookimpl
def plasmid_defaults(config: Config) -> None:
    """``--routing-replay r3`` replays the engine's routing: ask the engine for it
    (``--return-routed-experts``, unless given)."""
    if getattr(config.option, "trainer", None) == "megatron" and getattr(config.option, "routing_replay", None) == "r3":
        config.set_default("return_routed_experts", True)


@hookimpl
def plasmid_trainers(register):
    register("megatron", "plasmid_megatron.trainer:MegatronTrainer")
