"""``disk``: versioned safetensors directories in Hugging Face layout; engines load by version.

The trainer (rank 0) writes ``<--sync-dir>/v{version}/`` (default ``<run dir>/weights``): one
safetensors file per bucket of ``--update-weight-buffer-size`` bytes, named as
``save_pretrained`` names shards (``model.safetensors``, or ``model-00001-of-0000N.safetensors``
with ``model.safetensors.index.json``), plus ``config.json`` / ``generation_config.json`` of
``--model``, so ``AutoModelForCausalLM.from_pretrained`` loads the directory. It is written under
a temporary name and renamed, so an engine never sees half a version. Each engine then reads it
shard by shard and loads it (``engine.update_weights``). The newest ``--sync-keep-versions``
directories are kept.

Each tensor's CRC32 goes into ``plasmid_weights.json``; an engine checks what it read against it
before loading (``--sync-checksums``). Writing is the ``send`` phase, each engine's reading and
loading its ``load`` phase, both under ``--sync-timeout`` (:mod:`plasmid_torch.sync_guard`). An engine
whose server loads the directory itself (``load_weights_from_disk``: SGLang, vLLM) is past plasmid's
reading, so with ``--sync-checksums`` it also reports CRC32s of a sample of every shard as it holds
it after the load (:meth:`~plasmid_torch.sync_guard.SyncGuard.check_loaded`, ``sync/loaded_checksums``).

Works in any runtime: locally the trainer and the engines read and write the same directory; on
a Ray cluster of several nodes ``--sync-dir`` must be a shared file system.

Registered by plugins, not here: plasmid-sync as ``disk`` (``"plasmid_torch.disk_sync:DiskSync"``),
plasmid-sglang and plasmid-vllm as ``sglang-disk`` and ``vllm-disk`` (subclasses that only name the
transport in errors, :attr:`DiskSync.transport`). Its options, ``--sync-dir`` and ``--sync-keep-versions``,
are :class:`DiskSyncOptions`, declared by both plugins (plasmid-sync's ``delta`` reads them too).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

from plasmid.config import Config
from plasmid.kernel_options import GeneralOptions, ScheduleOptions
from plasmid.options import Options, option
from plasmid.protocols import RolloutEngine, SupportsDiskWeights, Trainer
from plasmid.remote import run_on
from plasmid.types import SyncReport
from plasmid_torch.directories import replace_dir
from plasmid_torch.sync_guard import (
    SyncGuard,
    SyncGuardOptions,
    bucket_checksums,
    check_received,
    loaded_sample,
    loaded_seed,
    who,
)
from plasmid_torch.tensors import as_torch, bucketed, tensor_bytes

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
#: Copied from ``--model`` so that the directory is a loadable model.
MODEL_FILES = ("config.json", "generation_config.json")
#: What the disk sync writes beside the shards: version, bytes, shards, per-tensor CRC32.
VERSION_FILE = "plasmid_weights.json"


class DiskSyncOptions(Options, group="sync on disk",
                      description="weight versions on disk: --weight-sync disk or delta (plasmid-sync), "
                                  "sglang-disk (plasmid-sglang)"):
    """Where the syncs that write weights to disk keep them (``disk``, ``delta``, ``sglang-disk``)."""

    sync_dir: Path | None = option(None, "where disk and delta write weight versions; on a multi-node cluster, "
                                   "a shared file system", default_text="<run dir>/weights")
    sync_keep_versions: int = option(2, "versions (disk) or updates (delta) kept on disk, newest first", min=1)

    def root(self, run_dir: str | Path) -> Path:
        """``--sync-dir``, or ``<run_dir>/weights``."""
        return self.sync_dir if self.sync_dir is not None else Path(run_dir) / "weights"


def sync_root(config: Config) -> Path:
    """``--sync-dir``, or ``<run dir>/weights``."""
    return DiskSyncOptions.of(config).root(config.run_dir)


def version_dir(root: str | Path, version: int) -> Path:
    return Path(root) / f"v{version}"


class DiskSync:
    """The ``disk`` weight sync; built as ``DiskSync(config)``.

    A version written by this sync in this run is written once: syncing the same version again
    (a restarted engine catching up) reloads the existing directory.
    """

    option_classes: ClassVar[tuple[type[Options], ...]] = (DiskSyncOptions, ScheduleOptions, GeneralOptions,
                                                           SyncGuardOptions)
    #: the name its errors give the transport: the provider's (an engine plugin registers a subclass
    #: under its own name, ``sglang-disk``, ``vllm-disk``)
    transport: ClassVar[str] = "disk"

    def __init__(self, config: Config) -> None:
        self.options = DiskSyncOptions.of(config)
        self.bucket_bytes = ScheduleOptions.of(config).update_weight_buffer_size
        self.root = self.options.root(config.run_dir)
        model = GeneralOptions.of(config).model
        self.model_dir = str(model) if model else ""
        self.keep = self.options.sync_keep_versions
        self.written: dict[int, tuple[int, int, list[tuple[str, int, list[int]]]]] = {}
        self.guard = SyncGuard(config, self.transport)

    async def sync(self, trainer: Trainer, engines: Sequence[RolloutEngine], weight_version: int) -> SyncReport:
        started = time.perf_counter()
        directory = version_dir(self.root, weight_version)
        if weight_version not in self.written:
            self.written[weight_version] = await self.guard.phase(
                run_on(trainer, write_version, str(self.root), weight_version, self.bucket_bytes, self.model_dir,
                       self.guard.checksums), "send", trainer)
        moved, buckets, sample = self.written[weight_version]
        self.guard.moved(moved)
        await self.guard.each_engine("load", engines, lambda engine, index: run_on(
            engine, load_version, str(directory), weight_version, self.bucket_bytes,
            "disk" if self.guard.checksums else "", who(engine, index)))
        loaded = await self.guard.check_loaded(engines, sample)
        await self.guard.resume(engines)
        prune_versions(self.root, self.keep)
        metrics = await self.guard.verify(trainer, engines, self.bucket_bytes)
        if loaded:
            metrics["sync/loaded_checksums"] = float(loaded)
        return SyncReport(bytes=moved, seconds=time.perf_counter() - started, weight_version=weight_version,
                          buckets=buckets, metrics=metrics)


def prune_versions(root: Path, keep: int) -> list[Path]:
    """Remove all but the newest ``keep`` ``v{N}`` directories under ``root``; the removed."""
    if not root.is_dir():
        return []
    versions = sorted((int(p.name[1:]), p) for p in root.iterdir() if p.is_dir() and p.name[1:].isdigit()
                      and p.name.startswith("v"))
    removed = [path for _, path in versions[:-keep]]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


# ------------------------------------------------------------------------------ in the trainer's process
def write_version(trainer: Any, root: str, weight_version: int, bucket_bytes: int, model_dir: str,
                  sample: bool = False) -> tuple[int, int, list[tuple[str, int, list[int]]]]:
    """Write ``v{weight_version}`` atomically (replacing an older one); ``(bytes, shards, loaded
    sample)``: with ``sample``, :func:`~plasmid_torch.sync_guard.loaded_sample` of every shard (one
    bucket each), else empty."""
    from safetensors.torch import save_file

    final = version_dir(root, weight_version)
    staging = final.with_name(f"{final.name}.tmp-{uuid.uuid4().hex[:8]}")
    staging.mkdir(parents=True)
    written, shards = 0, []
    checksums: dict[str, int] = {}
    loaded: list[tuple[str, int, list[int]]] = []
    for number, bucket in enumerate(trainer.export_weights(bucket_bytes), start=1):
        tensors = {name: as_torch(tensor).contiguous() for name, tensor in bucket}
        checksums.update(zip(tensors, bucket_checksums(list(tensors.items())), strict=True))
        if sample:
            loaded += loaded_sample(list(tensors.items()), loaded_seed(weight_version, number - 1))
        shard = f"shard-{number:05d}.safetensors"
        save_file(tensors, str(staging / shard), metadata={"format": "pt"})
        shards.append((shard, list(tensors)))
        written += sum(tensor_bytes(tensor) for tensor in tensors.values())
    name_shards(staging, shards, written)
    for name in MODEL_FILES:
        if model_dir and (Path(model_dir) / name).is_file():
            shutil.copy2(Path(model_dir) / name, staging / name)
    (staging / VERSION_FILE).write_text(json.dumps({"weight_version": weight_version, "bytes": written,
                                                    "shards": len(shards), "checksums": checksums}))
    replace_dir(staging, final)
    return written, len(shards), loaded


def shard_name(index: int, count: int) -> str:
    """Hugging Face's name of shard ``index`` (1-based) of ``count``."""
    return f"model-{index:05d}-of-{count:05d}.safetensors"


def name_shards(directory: Path, shards: Sequence[tuple[str | Path, Sequence[str]]], total: int) -> None:
    """Give the written safetensors files ``shards`` (``(file, tensor names)`` in order; a file
    relative to ``directory`` or absolute) the names ``save_pretrained`` uses: one file becomes
    ``model.safetensors``; several become ``model-0000i-of-0000N.safetensors`` with
    ``model.safetensors.index.json`` (``metadata.total_size`` = ``total`` bytes, ``weight_map``).
    Used by the disk sync and by plasmid-megatron's sharded checkpoint export."""
    if len(shards) == 1:
        os.replace(directory / shards[0][0], directory / SINGLE_FILE)
        return
    weight_map: dict[str, str] = {}
    for number, (shard, names) in enumerate(shards, start=1):
        final_name = shard_name(number, len(shards))
        os.replace(directory / shard, directory / final_name)
        weight_map.update({name: final_name for name in names})
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=1) + "\n")


# ------------------------------------------------------------------------------ in each engine's process
def shard_files(directory: str | Path) -> list[Path]:
    """The safetensors files of a version directory, in order."""
    directory = Path(directory)
    if (directory / INDEX_FILE).is_file():
        weight_map = json.loads((directory / INDEX_FILE).read_text())["weight_map"]
        return [directory / name for name in sorted(set(weight_map.values()))]
    if (directory / SINGLE_FILE).is_file():
        return [directory / SINGLE_FILE]
    raise FileNotFoundError(f"{directory} holds no {SINGLE_FILE} or {INDEX_FILE}: not a weights version written "
                            f"by the disk sync (was it pruned? raise --sync-keep-versions)")


def read_buckets(directory: str | Path, bucket_bytes: int) -> Iterator[list[tuple[str, Any]]]:
    """The tensors of a version directory in buckets of at most ``bucket_bytes`` bytes."""
    from safetensors import safe_open

    def tensors() -> Iterator[tuple[str, Any]]:
        for file in shard_files(directory):
            with safe_open(str(file), framework="pt") as reader:
                for name in reader.keys():
                    yield name, reader.get_tensor(name)

    yield from bucketed(tensors(), bucket_bytes)


async def load_version(engine: RolloutEngine, directory: str, weight_version: int, bucket_bytes: int,
                       check: str = "", receiver: str = "the engine") -> int:
    """Load version directory ``directory`` into ``engine``; bytes loaded.

    An engine that loads checkpoint directories natively (:class:`plasmid.protocols.SupportsDiskWeights`,
    e.g. SGLang's ``/update_weights_from_disk``) is handed the directory; any other engine gets
    it bucket by bucket through ``update_weights``, each bucket first checked against the CRC32s
    the trainer wrote when ``check`` names the transport (``""``: unchecked; ``receiver`` names the
    engine in the error).

    :raises plasmid_torch.sync_guard.SyncMismatch: a tensor read differs from the one written."""
    if isinstance(engine, SupportsDiskWeights):
        await engine.load_weights_from_disk(directory, weight_version)
        return sum(path.stat().st_size for path in Path(directory).glob("*.safetensors"))
    version_file = Path(directory) / VERSION_FILE
    written = json.loads(version_file.read_text()).get("checksums") if check and version_file.is_file() else None
    loaded = 0
    buckets = iter(read_buckets(directory, bucket_bytes))
    while (bucket := await asyncio.to_thread(next, buckets, None)) is not None:
        if written is not None:
            check_received(bucket, [written.get(name, -1) for name, _ in bucket], check, receiver)
        await engine.update_weights(bucket, weight_version)
        loaded += sum(tensor_bytes(tensor) for _, tensor in bucket)
    return loaded
