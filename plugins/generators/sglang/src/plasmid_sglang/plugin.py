"""Hook implementations of plasmid-sglang: the ``sglang`` engine, its weight syncs, its options.

Neither torch nor sglang is imported here: providers are ``"module:attr"`` strings and the
``--sglang-<ServerArgs field>`` options are read from SGLang's source (:mod:`plasmid_sglang.native`).
"""

from __future__ import annotations

from plasmid import hookimpl
from plasmid.config import Config, OptionParser
from plasmid_serving.hooks import add_engine_options, check_external_addrs
from plasmid_sglang.native import PLASMID_DEFAULTS, native_fields
from plasmid_sglang.options import SGLangOptions
from plasmid_torch.disk_sync import DiskSyncOptions


@hookimpl
def plasmid_addoption(parser: OptionParser) -> None:
    # DiskSyncOptions: sglang-disk's, shared with plasmid-sync's disk
    add_engine_options(parser, (SGLangOptions, DiskSyncOptions), prefix="sglang", label="SGLang",
                       native="SGLang ServerArgs fields", fields=native_fields(), plasmid_defaults=PLASMID_DEFAULTS)


@hookimpl
def plasmid_configure(config: Config) -> None:
    check_external_addrs(config, SGLangOptions)  # across plugins: the chosen engine and the kernel's --engines


@hookimpl
def plasmid_generators(register):
    register("sglang", "plasmid_sglang.engine:SGLangEngine")


@hookimpl
def plasmid_weight_syncs(register):
    register("sglang-tensor", "plasmid_sglang.syncs:TensorSync")
    register("sglang-distributed", "plasmid_sglang.syncs:DistributedSync")
    register("sglang-disk", "plasmid_sglang.syncs:SGLangDiskSync")  # uses the engine's /update_weights_from_disk
