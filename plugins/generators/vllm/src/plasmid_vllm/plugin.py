"""Hook implementations of plasmid-vllm: the ``vllm`` engine, its weight syncs, its options.

Neither torch nor vllm is imported here: providers are ``"module:attr"`` strings and the
``--vllm-<engine argument>`` options are read from vLLM's source (:mod:`plasmid_vllm.native`).
"""

from __future__ import annotations

from plasmid import hookimpl
from plasmid.config import Config, OptionParser
from plasmid.errors import UsageError
from plasmid.kernel_options import RolloutOptions
from plasmid_serving.hooks import add_engine_options, check_external_addrs
from plasmid_torch.disk_sync import DiskSyncOptions
from plasmid_vllm.native import PLASMID_DEFAULTS, native_fields
from plasmid_vllm.options import VLLMOptions


@hookimpl
def plasmid_addoption(parser: OptionParser) -> None:
    # DiskSyncOptions: vllm-disk's, shared with plasmid-sync's disk
    add_engine_options(parser, (VLLMOptions, DiskSyncOptions), prefix="vllm", label="vLLM",
                       native="vLLM engine arguments (AsyncEngineArgs fields)", fields=native_fields(),
                       plasmid_defaults=PLASMID_DEFAULTS)


@hookimpl
def plasmid_configure(config: Config) -> None:
    check_external_addrs(config, VLLMOptions)
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
    register("vllm-disk", "plasmid_vllm.syncs:VLLMDiskSync")  # uses the engine's load_weights_from_disk
    register("vllm-nccl", "plasmid_vllm.syncs:NCCLSync")
    register("vllm-lora", "plasmid_vllm.lora_sync:AdapterSync")  # LoRA adapters alone (--vllm-enable-lora)
