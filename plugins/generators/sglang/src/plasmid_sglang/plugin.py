"""Hook implementations of plasmid-sglang: the ``sglang`` engine, its weight syncs, its options.

Neither torch nor sglang is imported here: providers are ``"module:attr"`` strings and the
``--sglang-<ServerArgs field>`` options are read from SGLang's source (:mod:`plasmid_sglang.native`).
"""

from __future__ import annotations

from plasmid import hookimpl
from plasmid.config import Config, OptionParser
from plasmid.errors import UsageError
from plasmid.kernel_options import ScheduleOptions
from plasmid_serving.native_options import add_options
from plasmid_sglang.native import PLASMID_DEFAULTS, native_fields
from plasmid_sglang.options import SGLangOptions
from plasmid_torch.disk_sync import DiskSyncOptions


@hookimpl
def plasmid_addoption(parser: OptionParser) -> None:
    parser.add_options(SGLangOptions)
    parser.add_options(DiskSyncOptions)  # sglang-disk's, shared with plasmid-sync's disk
    native = parser.getgroup("sglang native", "SGLang ServerArgs fields, generated from the installed version; "
                             "unset means SGLang's default, or plasmid's for: "
                             + "; ".join(f"{name} ({why})" for name, why in PLASMID_DEFAULTS.items()))
    add_options(native, native_fields())


@hookimpl
def plasmid_configure(config: Config) -> None:
    # across plugins: the chosen engine and the kernel's --engines
    if config.option.engine == "sglang" and SGLangOptions.of(config).external_addresses \
            and ScheduleOptions.of(config).engines != 1:
        raise UsageError("--sglang-external-addrs gives every server to one engine, which balances requests over "
                         "them; use --engines 1 with it (plugin sglang)")


@hookimpl
def plasmid_generators(register):
    register("sglang", "plasmid_sglang.engine:SGLangEngine")


@hookimpl
def plasmid_weight_syncs(register):
    register("sglang-tensor", "plasmid_sglang.syncs:TensorSync")
    register("sglang-distributed", "plasmid_sglang.syncs:DistributedSync")
    register("sglang-disk", "plasmid_torch.disk_sync:DiskSync")  # uses the engine's /update_weights_from_disk
