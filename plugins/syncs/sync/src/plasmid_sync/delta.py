"""``delta``: like ``disk``, but only what changed since the previous sync, compressed.

Each sync is a numbered *update* of this sync's *writer* (a random id per run): update ``n``
takes the engines from update ``n - 1`` to the new weights. For every tensor the trainer (rank
0) writes ``new XOR previous`` over the raw bytes (bit-exact, whatever the dtype), with the
bytes regrouped by significance (all first bytes, then all second bytes, ...: the XOR of
nearby floats is zero in the high bytes, so those planes compress to almost nothing), compressed
with zstd (``--delta-zstd-level``), and a BLAKE2b checksum of the new tensor's bytes. An engine
rebuilds ``new = served XOR delta`` and checks the checksum.

Layout under ``<--sync-dir>/delta/`` (default ``<run dir>/weights/delta``)::

    000007.delta/   manifest.json + bucket-00001.zst ...   update 7 over update 6
    000007.full/    the same for engines without update 6 (first sync, restarted engine)

``manifest.json`` holds ``writer``, ``sequence``, ``base_sequence`` (``null`` for a full
snapshot), ``weight_version``, ``base_weight_version`` and per tensor its name, dtype, shape,
bucket file, offset, length and checksum (``dtype`` is numpy's dtype string, or ``bfloat16``,
whose raw 16-bit patterns are stored and checked). Directories are written under a temporary name and
renamed; the newest ``--sync-keep-versions`` updates are kept.

Applying is refused with a clear error when it is out of order (the engine is not at the
update it builds on, or serves another weight version), twice (the engine already applied it),
or when the reconstruction does not match its checksum. The trainer keeps a copy of the last
synced weights (one model in host memory) as the base of the next delta; the first sync, and any
engine that lacks the base (a restarted one), get a full snapshot. The report's ``bytes`` are
the bytes written; its metrics add ``sync/raw_bytes`` (the tensors' size), ``sync/bytes_saved``
(raw size minus the delta's, or the full snapshot's when no delta was written) and
``sync/compression_ratio``.

Deadlines (:mod:`plasmid_torch.sync_guard`, ``--sync-timeout``): asking the engines which update
they hold is the ``connect`` phase, writing an update the trainer's ``send``, applying it each
engine's ``load``, then ``resume``; ``--verify-sync-every`` reads weights back. The BLAKE2b
checksums above are this sync's transport checksums (always on: a delta needs them).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from plasmid.config import Config
from plasmid.kernel_options import ScheduleOptions
from plasmid.options import Options
from plasmid.protocols import RolloutEngine, Trainer
from plasmid.remote import run_on
from plasmid.types import SyncReport
from plasmid_sync.options import SyncOptions
from plasmid_torch.disk_sync import DiskSyncOptions
from plasmid_torch.sync_guard import SyncGuard, SyncGuardOptions
from plasmid_torch.tensors import PROCESS_STATE, from_raw, raw_array, raw_array_of_dtype, raw_dtype

MANIFEST = "manifest.json"
#: A tensor as byte-level code sees it: its raw numpy array and its dtype name (numpy's dtype string, or
#: ``bfloat16`` with the array holding the bit patterns as uint16), from ``plasmid_torch.tensors.raw_array``.
RawTensor = tuple[Any, str]
FORMAT = "plasmid-delta/1"


class DeltaSync:
    """The ``delta`` weight sync; built as ``DeltaSync(config)``."""

    option_classes: ClassVar[tuple[type[Options], ...]] = (SyncOptions, DiskSyncOptions, ScheduleOptions,
                                                           SyncGuardOptions)

    def __init__(self, config: Config) -> None:
        on_disk = DiskSyncOptions.of(config)
        self.bucket_bytes = ScheduleOptions.of(config).update_weight_buffer_size
        self.root = on_disk.root(config.run_dir) / "delta"
        self.level = SyncOptions.of(config).delta_zstd_level
        self.keep = on_disk.sync_keep_versions
        self.writer = uuid.uuid4().hex[:16]
        self.sequence = 0
        self.weight_version: int | None = None
        self.guard = SyncGuard(config, "delta")

    async def sync(self, trainer: Trainer, engines: Sequence[RolloutEngine], weight_version: int) -> SyncReport:
        started = time.perf_counter()
        applied = await self.guard.each_engine("connect", engines,
                                               lambda engine, _index: run_on(engine, applied_update, self.writer), 0)
        written, raw, delta_bytes, full_bytes, buckets = 0, 0, None, None, 0
        if self.sequence == 0 or weight_version != self.weight_version:  # new weights (else: catching up)
            stats = await self.guard.phase(run_on(trainer, write_delta, self.writer, str(self.root), self.sequence + 1,
                                                  weight_version, self.bucket_bytes, self.level), "send", trainer)
            self.sequence, self.weight_version = self.sequence + 1, weight_version
            raw, buckets, delta_bytes = stats["raw_bytes"], stats["buckets"], stats.get("delta_bytes")
            written += delta_bytes or 0
        delta_dir = self.root / f"{self.sequence:06d}.delta"
        full_dir = self.root / f"{self.sequence:06d}.full"
        plan = []
        for engine, at in zip(engines, applied, strict=True):
            if at == self.sequence:
                continue  # already serves these weights
            plan.append((engine, delta_dir if at == self.sequence - 1 and delta_dir.is_dir() else full_dir))
        if any(directory == full_dir for _, directory in plan) and not full_dir.is_dir():
            stats = await self.guard.phase(run_on(trainer, write_full, self.writer, str(self.root), self.sequence,
                                                  self.bucket_bytes, self.level), "send", trainer)
            full_bytes, raw, buckets = stats["full_bytes"], stats["raw_bytes"], stats["buckets"]
            written += full_bytes
        self.guard.moved(raw)
        directories = {id(engine): directory for engine, directory in plan}  # not planned: serves it already
        await self.guard.each_engine("load", engines, lambda engine, _index: run_on(
            engine, apply_update, str(directories[id(engine)])) if id(engine) in directories else _nothing())
        await self.guard.resume(engines)
        prune_updates(self.root, self.keep)
        primary = delta_bytes if delta_bytes is not None else full_bytes
        metrics = {"sync/raw_bytes": float(raw), **await self.guard.verify(trainer, engines, self.bucket_bytes)}
        if primary is not None:
            metrics["sync/bytes_saved"] = float(raw - primary)
            metrics["sync/compression_ratio"] = raw / max(primary, 1)
        return SyncReport(bytes=written, seconds=time.perf_counter() - started, weight_version=weight_version,
                          buckets=buckets, metrics=metrics)


async def _nothing() -> None:
    """An engine's ``load`` phase when it already holds the update."""


def prune_updates(root: Path, keep: int) -> None:
    """Remove the directories of all but the newest ``keep`` update numbers under ``root``."""
    if not root.is_dir():
        return
    numbered = [(int(p.name.split(".")[0]), p) for p in root.iterdir()
                if p.is_dir() and p.name.split(".")[0].isdigit() and p.suffix in (".delta", ".full")]
    newest = sorted({number for number, _ in numbered})[-keep:]
    for number, path in numbered:
        if number not in newest:
            shutil.rmtree(path, ignore_errors=True)


# ------------------------------------------------------------------------------ encoding
def checksum(array: Any) -> str:
    """BLAKE2b-128 of an array's raw bytes (C order)."""
    import numpy as np

    return hashlib.blake2b(np.ascontiguousarray(array).view(np.uint8).reshape(-1), digest_size=16).hexdigest()


def byte_planes(raw: Any, itemsize: int) -> Any:
    """The bytes of ``raw`` (any contiguous array of ``n`` items of ``itemsize`` bytes) as
    ``[n * itemsize]`` uint8 regrouped in ``itemsize`` planes: byte 0 of every item, then byte 1..."""
    import numpy as np

    return np.ascontiguousarray(raw).view(np.uint8).reshape(-1, itemsize).T.copy().reshape(-1)


def from_byte_planes(planes: Any, itemsize: int) -> Any:
    return planes.reshape(itemsize, -1).T.copy().reshape(-1)


@dataclass
class Base:
    """The trainer-side copy of the weights of the writer's last update: per tensor name, its
    raw array and dtype name (:func:`plasmid_torch.tensors.raw_array`)."""

    sequence: int = 0
    weight_version: int = 0
    tensors: dict[str, RawTensor] = field(default_factory=dict)


class _Staging:
    """Writes one update directory: bucket files of zstd frames and the manifest, atomically."""

    def __init__(self, root: str, name: str, level: int) -> None:
        import zstandard

        self.final = Path(root) / name
        self.directory = self.final.with_name(f"{name}.tmp-{uuid.uuid4().hex[:8]}")
        self.directory.mkdir(parents=True)
        self.compressor = zstandard.ZstdCompressor(level=level)
        self.entries: list[dict[str, Any]] = []
        self.bytes = 0

    def add_bucket(self, number: int, tensors: list[tuple[str, RawTensor, Any]]) -> None:
        """``tensors``: ``(name, new tensor's raw array and dtype name, bytes to store)``; one
        ``bucket-N.zst`` file."""
        file_name = f"bucket-{number:05d}.zst"
        offset = 0
        with open(self.directory / file_name, "wb") as out:
            for name, (new, dtype), payload in tensors:
                frame = self.compressor.compress(byte_planes(payload, new.dtype.itemsize).tobytes())
                out.write(frame)
                self.entries.append({"name": name, "dtype": dtype, "shape": list(new.shape),
                                     "file": file_name, "offset": offset, "length": len(frame),
                                     "checksum": checksum(new)})
                offset += len(frame)
        self.bytes += offset

    def commit(self, manifest: dict[str, Any]) -> None:
        manifest = {"format": FORMAT, **manifest, "tensors": self.entries}
        (self.directory / MANIFEST).write_text(json.dumps(manifest))
        if self.final.exists():
            shutil.rmtree(self.final)
        os.replace(self.directory, self.final)


# ------------------------------------------------------------------------------ in the trainer's process
def write_delta(trainer: Any, writer: str, root: str, sequence: int, weight_version: int, bucket_bytes: int,
                level: int) -> dict[str, Any]:
    """Export the weights; write update ``sequence`` as a delta over the kept base when the base is
    update ``sequence - 1``; keep the new weights as the base. Returns sizes."""

    base: Base = PROCESS_STATE.get(f"delta/{writer}") or Base()
    has_base = base.sequence == sequence - 1 and bool(base.tensors)
    staging = _Staging(root, f"{sequence:06d}.delta", level) if has_base else None
    new_tensors: dict[str, RawTensor] = {}
    raw, buckets = 0, 0
    for number, bucket in enumerate(trainer.export_weights(bucket_bytes), start=1):
        arrays = [(name, raw_array(tensor)) for name, tensor in bucket]
        if staging is not None:
            staging.add_bucket(number, [(name, new, _xor(base.tensors.get(name), new, name)) for name, new in arrays])
        new_tensors.update(arrays)
        raw += sum(new.nbytes for _, (new, _dtype) in arrays)
        buckets += 1
    stats: dict[str, Any] = {"raw_bytes": raw, "buckets": buckets}
    if staging is not None:
        staging.commit({"writer": writer, "sequence": sequence, "base_sequence": sequence - 1,
                        "weight_version": weight_version, "base_weight_version": base.weight_version})
        stats["delta_bytes"] = staging.bytes
    PROCESS_STATE[f"delta/{writer}"] = Base(sequence, weight_version, new_tensors)
    return stats


def write_full(trainer: Any, writer: str, root: str, sequence: int, bucket_bytes: int, level: int) -> dict[str, Any]:
    """Write the kept base (update ``sequence``) as a full snapshot, in buckets of at most
    ``bucket_bytes`` (as the trainer exports them). Returns sizes."""
    base: Base | None = PROCESS_STATE.get(f"delta/{writer}")
    if base is None or base.sequence != sequence:
        raise RuntimeError(f"delta sync: the trainer keeps update {base.sequence if base else None}, not "
                           f"{sequence}; cannot write its full snapshot")
    staging = _Staging(root, f"{sequence:06d}.full", level)
    number, pending, size, raw = 0, [], 0, 0
    for name, (array, dtype) in base.tensors.items():
        if pending and size + array.nbytes > bucket_bytes:
            number += 1
            staging.add_bucket(number, pending)
            pending, size = [], 0
        pending.append((name, (array, dtype), array))
        size += array.nbytes
        raw += array.nbytes
    if pending:
        number += 1
        staging.add_bucket(number, pending)
    staging.commit({"writer": writer, "sequence": sequence, "base_sequence": None,
                    "weight_version": base.weight_version, "base_weight_version": None})
    return {"full_bytes": staging.bytes, "raw_bytes": raw, "buckets": number}


def _xor(base: RawTensor | None, new: RawTensor, name: str) -> Any:
    import numpy as np

    (new_array, new_dtype) = new
    if base is None or base[0].shape != new_array.shape or base[1] != new_dtype:
        raise ValueError(f"delta sync: tensor '{name}' has no base of dtype {new_dtype} and shape {new_array.shape} "
                         f"in the previous update; the trainer's exported tensors changed between syncs")
    return np.bitwise_xor(base[0].view(np.uint8), new_array.view(np.uint8)).reshape(-1)


# ------------------------------------------------------------------------------ in each engine's process
def _applied_key(engine: Any) -> str:
    return f"delta-applied/{id(engine)}"


def applied_update(engine: Any, writer: str) -> int:
    """The number of the last update of ``writer`` this engine applied (0: none)."""
    found = PROCESS_STATE.get(_applied_key(engine))
    return found[1] if found and found[0] == writer else 0


async def apply_update(engine: Any, directory: str) -> int:
    """Apply the update in ``directory`` (delta or full) to ``engine``; returns tensors loaded.

    :raises ValueError: out of order (the engine does not hold the update or the weight version the
        delta builds on), applied twice, or a tensor whose reconstruction fails its checksum.
    """
    import numpy as np
    import zstandard

    path = Path(directory)
    manifest = json.loads((path / MANIFEST).read_text())
    writer, sequence, base_sequence = manifest["writer"], manifest["sequence"], manifest["base_sequence"]
    at = applied_update(engine, writer)
    where = f"delta sync: update {sequence} ({path})"
    if at >= sequence:
        raise ValueError(f"{where} was already applied to this engine (it is at update {at}); applying an update "
                         f"twice would corrupt the weights")
    if base_sequence is not None:
        if at != base_sequence:
            raise ValueError(f"{where} builds on update {base_sequence}, but this engine is at update {at}: out of "
                             f"order; apply update {at + 1} first, or the full snapshot "
                             f"{path.with_suffix('.full').name}")
        if engine.weight_version != manifest["base_weight_version"]:
            raise ValueError(f"{where} builds on weight version {manifest['base_weight_version']}, but the engine "
                             f"serves version {engine.weight_version}: its weights were changed by something else")
    decompressor = zstandard.ZstdDecompressor()
    by_file: dict[str, list[dict[str, Any]]] = {}
    for entry in manifest["tensors"]:
        by_file.setdefault(entry["file"], []).append(entry)
    loaded = 0
    for file_name, entries in by_file.items():
        data = (path / file_name).read_bytes()
        served = await engine.get_weights([e["name"] for e in entries]) if base_sequence is not None else {}
        bucket = []
        for entry in entries:
            dtype = raw_dtype(entry["dtype"])
            frame = data[entry["offset"]: entry["offset"] + entry["length"]]
            payload = from_byte_planes(np.frombuffer(decompressor.decompress(frame), dtype=np.uint8), dtype.itemsize)
            if base_sequence is not None:
                base, base_dtype = raw_array_of_dtype(served[entry["name"]], entry["dtype"])
                if base_dtype != entry["dtype"] or list(base.shape) != entry["shape"]:
                    raise ValueError(f"{where}: the engine serves '{entry['name']}' as {base_dtype} "
                                     f"{list(base.shape)}, the delta is over {entry['dtype']} {entry['shape']}; a "
                                     f"delta needs the engine to serve the trainer's dtype")
                payload = np.bitwise_xor(base.view(np.uint8).reshape(-1), payload)
            new = payload.view(dtype).reshape(entry["shape"])
            if checksum(new) != entry["checksum"]:
                raise ValueError(f"{where}: tensor '{entry['name']}' does not match its checksum after "
                                 f"reconstruction; the engine's base weights differ from update {base_sequence}")
            bucket.append((entry["name"], from_raw(new, entry["dtype"])))
        await engine.update_weights(bucket, manifest["weight_version"])
        loaded += len(bucket)
    PROCESS_STATE[_applied_key(engine)] = (writer, sequence)
    return loaded
