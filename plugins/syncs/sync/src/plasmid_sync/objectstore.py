"""``objectstore``: buckets of numpy arrays through Ray's shared-memory object store.

Per bucket of at most ``--update-weight-buffer-size`` bytes: the trainer (rank 0) converts the
bucket to numpy and ``ray.put`` s it; the driver hands the reference to every engine, which
reads it (zero-copy from the node's object store) and loads it. The next bucket is put while the
engines load the current one, so at most two buckets are in the store at a time. Needs the Ray
runtime: the trainer and the engines must be actors.

Checks (:mod:`plasmid_torch.sync_guard`): putting a bucket is the trainer's ``gather`` phase, an
engine's reading and loading it its ``load`` phase, then ``resume``, each under ``--sync-timeout``;
the trainer sends each tensor's CRC32 with the reference and an engine checks what it read before
loading it (``--sync-checksums``); ``--verify-sync-every`` reads weights back.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from typing import Any, ClassVar

from plasmid.config import Config
from plasmid.kernel_options import ScheduleOptions
from plasmid.options import Options
from plasmid.protocols import RolloutEngine, Trainer
from plasmid.remote import run_on
from plasmid.types import SyncReport
from plasmid_torch.sync_guard import SyncGuard, SyncGuardOptions, bucket_checksums, check_received, who
from plasmid_torch.tensors import PROCESS_STATE, require_separate_processes, tensor_bytes, to_transport


class ObjectStoreSync:
    """The ``objectstore`` weight sync; built as ``ObjectStoreSync(config)``."""

    option_classes: ClassVar[tuple[type[Options], ...]] = (ScheduleOptions, SyncGuardOptions)

    def __init__(self, config: Config) -> None:
        self.bucket_bytes = ScheduleOptions.of(config).update_weight_buffer_size
        self.key = f"objectstore-{uuid.uuid4().hex}"
        self.guard = SyncGuard(config, "objectstore")

    def _put_next(self, trainer: Trainer, key: str) -> asyncio.Future[Any]:
        return asyncio.ensure_future(self.guard.phase(run_on(trainer, put_next_bucket, key, self.guard.checksums),
                                                      "gather", trainer, None, self.bucket_bytes))

    async def sync(self, trainer: Trainer, engines: Sequence[RolloutEngine], weight_version: int) -> SyncReport:
        require_separate_processes("objectstore", trainer, engines)
        started = time.perf_counter()
        key = f"{self.key}-{uuid.uuid4().hex[:8]}"  # per call: a sync may run inside another (engine restart)
        await self.guard.phase(run_on(trainer, open_export, key, self.bucket_bytes), "gather", trainer, None, 0)
        moved, buckets, ended = 0, 0, False
        upcoming = self._put_next(trainer, key)
        try:
            while (item := await upcoming) is not None:
                reference, size, checksums = item
                upcoming = self._put_next(trainer, key)
                await self.guard.each_engine("load", engines, lambda engine, index, reference=reference, sums=checksums:
                                             run_on(engine, load_bucket, reference, weight_version, sums,
                                                    who(engine, index)), size)
                moved += size
                buckets += 1
            ended = True  # the trainer's side dropped its export with the last bucket
        finally:
            if not upcoming.done():
                upcoming.cancel()
            if not ended:
                await self.guard.phase(run_on(trainer, close_export, key), "gather", trainer, None, 0)
        await self.guard.resume(engines)
        self.guard.moved(moved)
        metrics = await self.guard.verify(trainer, engines, self.bucket_bytes)
        return SyncReport(bytes=moved, seconds=time.perf_counter() - started, weight_version=weight_version,
                          buckets=buckets, metrics=metrics)


# ------------------------------------------------------------------------------ in the trainer's process
def open_export(trainer: Any, key: str, bucket_bytes: int) -> None:
    PROCESS_STATE[key] = iter(trainer.export_weights(bucket_bytes))


def put_next_bucket(trainer: Any, key: str, checksums: bool = True) -> tuple[list[Any], int, list[int] | None] | None:
    """``([reference], bytes, CRC32 of each tensor or None)`` of the next bucket put in the object
    store, ``None`` at the end. (The reference is wrapped in a list so that Ray hands it over
    instead of resolving it.)"""
    import ray

    exporting = PROCESS_STATE.get(key)
    bucket = next(exporting, None) if exporting is not None else None
    if bucket is None:
        PROCESS_STATE.pop(key, None)
        return None
    arrays = [(name, to_transport(tensor)) for name, tensor in bucket]
    sums = bucket_checksums(arrays) if checksums else None
    return [ray.put(arrays)], sum(tensor_bytes(array) for _, array in arrays), sums


def close_export(trainer: Any, key: str) -> None:
    PROCESS_STATE.pop(key, None)


# ------------------------------------------------------------------------------ in each engine's process
async def load_bucket(engine: Any, reference: list[Any], weight_version: int, checksums: list[int] | None = None,
                      receiver: str = "the engine") -> None:
    """Read the bucket behind ``reference``, check it against the trainer's ``checksums`` (``None``:
    unchecked) and load it into ``engine``."""
    bucket = await reference[0]
    check_received(bucket, checksums, "objectstore", receiver)
    await engine.update_weights(bucket, weight_version)
