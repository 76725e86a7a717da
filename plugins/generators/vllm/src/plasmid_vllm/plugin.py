"""Hook implementations of plasmid-vllm: the ``vllm`` engine, its weight syncs, its options.

Neither torch nor vllm is imported here: providers are ``"module:attr"`` strings and the
``--vllm-<engine argument>`` options are read from vLLM's source (:mod:`plasmid_vllm.native`).
"""

from __future__ import annotations

from plasmid import hookimpl
from plasmid.config import Config, OptionParser
from plasmid.errors import UsageError
from plasmid.kernel_options import RolloutOptions, ScheduleOptions
from plasmid_serving.native_options import add_options
from plasmid_torch.disk_sync import DiskSyncOptions
from plasmid_vllm.native import PLASMID_DEFAULTS, native_fields
from plasmid_vllm.options import VLLMOptions


@hookimpl
def plasmid_addoption(parser: OptionParser) -> None:
    parser.add_options(VLLMOptions)
    parser.add_options(DiskSyncOptions)  # vllm-disk's, shared with plasmid-sync's disk
    native = parser.getgroup("vllm native", "vLLM engine arguments (AsyncEngineArgs fields), generated from the "
                             "installed version; unset means vLLM's default, or plasmid's for: "
                             + "; ".join(f"{name} ({why})" for name, why in PLASMID_DEFAULTS.items()))
    add_options(native, native_fields())


@hookimpl
def plasmid_configure(config: Config) -> None:
    if config.option.engine == "vllm" and VLLMOptions.of(config).external_addresses \
            and ScheduleOptions.of(config).engines != 1:
        raise UsageError("--vllm-external-addrs gives every server to one engine, which balances requests over "
                         "them; use --engines 1 with it (plugin vllm)")
    if config.option.engine == "vllm" and RolloutOptions.of(config).return_routed_experts:
        # before anything is written: otherwise a routing replay would fail at its first training step
        raise UsageError("--return-routed-experts: the vllm engine does not report mixture-of-experts routing "
                         "(megatron's --routing-replay r3 asks for it); use --engine torchgen or sglang, or "
                         "--routing-replay r2 (plugin vllm)")


@hookimpl
def plasmid_generators(register):
    register("vllm", "plasmid_vllm.engine:VLLMEngine")


@hookimpl
def plasmid_weight_syncs(register):
    register("vllm-disk", "plasmid_torch.disk_sync:DiskSync")  # uses the engine's load_weights_from_disk
    register("vllm-nccl", "plasmid_vllm.syncs:NCCLSync")
    register("vllm-lora", "plasmid_vllm.lora_sync:AdapterSync")  # LoRA adapters alone (--vllm-enable-lora)
