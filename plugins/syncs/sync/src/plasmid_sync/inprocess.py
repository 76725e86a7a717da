"""``inprocess``: trainer and engines share a process; tensors are handed over, not serialised."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import ClassVar

from plasmid.config import Config
from plasmid.kernel_options import ScheduleOptions
from plasmid.options import Options
from plasmid.protocols import RolloutEngine, Trainer
from plasmid.types import SyncReport
from plasmid_torch.tensors import tensor_bytes


class InProcessSync:
    """The ``inprocess`` weight sync; built by the kernel as ``InProcessSync(config)``.

    For each bucket of ``trainer.export_weights(--update-weight-buffer-size)`` it awaits
    ``update_weights`` on every engine concurrently, then flushes every engine's cache. Buckets are
    made one at a time, so the extra memory is about one bucket, not a copy of the model.

    Every bucket is sent with the new ``weight_version`` (engines set it on each update), so
    a response that finishes while the buckets are still arriving reports the new version:
    the caller should not generate during a sync when it needs exact versions.
    """

    option_classes: ClassVar[tuple[type[Options], ...]] = (ScheduleOptions,)

    def __init__(self, config: Config) -> None:
        self.bucket_bytes = ScheduleOptions.of(config).update_weight_buffer_size

    async def sync(self, trainer: Trainer, engines: Sequence[RolloutEngine], weight_version: int) -> SyncReport:
        started = time.perf_counter()
        moved, buckets = 0, 0
        for bucket in trainer.export_weights(self.bucket_bytes):
            await asyncio.gather(*(engine.update_weights(bucket, weight_version) for engine in engines))
            moved += sum(tensor_bytes(tensor) for _, tensor in bucket)
            buckets += 1
        await asyncio.gather(*(engine.flush_cache() for engine in engines))
        return SyncReport(bytes=moved, seconds=time.perf_counter() - started, weight_version=weight_version,
                          buckets=buckets)
