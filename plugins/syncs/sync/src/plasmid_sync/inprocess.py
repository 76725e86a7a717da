"""``inprocess``: trainer and engines share a process; tensors are handed over, not serialised, or
shared: an engine that can (:class:`~plasmid.protocols.SupportsWeightSharing`) serves a trainer's
own tensors (:class:`~plasmid.protocols.SupportsSharedWeights`) in place of its copy, so the model is
in memory once and a sync copies nothing (``--inprocess-share-weights``)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import ClassVar

from plasmid.config import Config
from plasmid.kernel_options import ScheduleOptions
from plasmid.options import Options
from plasmid.protocols import RolloutEngine, SupportsSharedWeights, SupportsWeightSharing, Trainer
from plasmid.types import SyncReport
from plasmid_sync.options import SyncOptions
from plasmid_torch.sync_guard import SyncGuard, SyncGuardOptions, loaded_sample, loaded_seed, reports_loaded
from plasmid_torch.tensors import tensor_bytes


class InProcessSync:
    """The ``inprocess`` weight sync; built by the kernel as ``InProcessSync(config)``.

    For each bucket of ``trainer.export_weights(--update-weight-buffer-size)`` it awaits
    ``update_weights`` on every engine concurrently, then flushes every engine's cache. Buckets are
    made one at a time, so the extra memory is about one bucket, not a copy of the model.

    An engine that loads through a server of its own and can report what it holds (``loaded_checksums``:
    SGLang, vLLM) is asked after each bucket for CRC32s of a sample of it, compared with the trainer's
    (``--sync-checksums``, :meth:`~plasmid_torch.sync_guard.SyncGuard.check_loaded`).

    Every bucket is sent with the new ``weight_version`` (engines set it on each update), so
    a response that finishes while the buckets are still arriving reports the new version:
    the caller should not generate during a sync when it needs exact versions.

    Shared weights (``--inprocess-share-weights auto``, the default, with ``--schedule sync`` and
    ``--update-weights-interval 1``): :meth:`start` hands the trainer's live tensors to every engine
    once, and each :meth:`sync` hands them again (nothing is copied: an engine already serving them
    only sets the version) and reports ``bytes=0`` and ``sync/shared_bytes``. Where the trainer or
    an engine cannot share (a sharded or LoRA trainer, another dtype or device, an engine in another
    process), the buckets are copied as above.
    """

    option_classes: ClassVar[tuple[type[Options], ...]] = (ScheduleOptions, SyncOptions, SyncGuardOptions)

    def __init__(self, config: Config) -> None:
        schedule = ScheduleOptions.of(config)
        self.bucket_bytes = schedule.update_weight_buffer_size
        #: whether engines may serve the trainer's own tensors: only where they never generate while a
        #: train step changes them (synchronous steps, a sync after each)
        self.may_share = (SyncOptions.of(config).inprocess_share_weights == "auto" and schedule.schedule == "sync"
                          and schedule.update_weights_interval == 1)
        #: bytes of weights the engines serve from the trainer's tensors (0: none shared)
        self.shared_bytes = 0
        self.guard = SyncGuard(config, "inprocess")

    async def start(self, trainer: Trainer, engines: Sequence[RolloutEngine]) -> None:
        """Share the trainer's weights with the engines before the first rollout (their copies, loaded
        from ``--model`` like the trainer's, are freed), where :attr:`may_share` and both sides can;
        each engine keeps its weight version."""
        await self._share(trainer, engines, [engine.weight_version for engine in engines])

    async def _share(self, trainer: Trainer, engines: Sequence[RolloutEngine], versions: list[int]) -> bool:
        """Hand the trainer's live tensors to every engine (engine ``i`` then at ``versions[i]``);
        whether they were shared (else the caller copies)."""
        sharers = [engine for engine in engines if isinstance(engine, SupportsWeightSharing)]
        if not (self.may_share and sharers and len(sharers) == len(engines)
                and isinstance(trainer, SupportsSharedWeights)):
            return False
        named = trainer.shared_weights()
        if named is None:
            return False
        shared = await self.guard.each_engine("load", sharers,
                                              lambda engine, index: engine.share_weights(named, versions[index]))
        self.shared_bytes = min(shared)
        return True

    async def sync(self, trainer: Trainer, engines: Sequence[RolloutEngine], weight_version: int) -> SyncReport:
        started = time.perf_counter()
        if await self._share(trainer, engines, [weight_version] * len(engines)):
            await self.guard.resume(engines)
            metrics = await self.guard.verify(trainer, engines, self.bucket_bytes)
            return SyncReport(bytes=0, seconds=time.perf_counter() - started, weight_version=weight_version,
                              metrics={"sync/shared_bytes": float(self.shared_bytes), **metrics})
        moved, buckets, loaded = 0, 0, 0
        reporting = self.guard.checksums and any(reports_loaded(engine) for engine in engines)
        for bucket in trainer.export_weights(self.bucket_bytes):
            size = sum(tensor_bytes(tensor) for _, tensor in bucket)
            await self.guard.each_engine(
                "load", engines, lambda engine, _i, bucket=bucket: engine.update_weights(bucket, weight_version), size)
            if reporting:
                loaded += await self.guard.check_loaded(engines, loaded_sample(bucket, loaded_seed(weight_version,
                                                                                                   buckets)))
            moved += size
            buckets += 1
        await self.guard.resume(engines)
        self.guard.moved(moved)
        metrics = await self.guard.verify(trainer, engines, self.bucket_bytes)
        if loaded:
            metrics["sync/loaded_checksums"] = float(loaded)
        return SyncReport(bytes=moved, seconds=time.perf_counter() - started, weight_version=weight_version,
                          buckets=buckets, metrics=metrics)
