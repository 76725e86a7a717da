"""Weight syncs into SGLang engines (``--weight-sync sglang-tensor|sglang-distributed|sglang-disk``).

Each works wherever the runtime placed the trainer and the engines: the trainer's half runs
through :func:`plasmid.remote.run_on` in the trainer's process, the engines' half in each
engine's process (module-level functions, plain-data arguments). Engines must be
:class:`plasmid_sglang.engine.SGLangEngine` (or proxies for them).

- ``sglang-tensor`` (colocate): the trainer packs each bucket of ``--update-weight-buffer-size``
  bytes into one flattened bucket and serialises it (``--sglang-tensor-transport``: the bytes,
  or CUDA IPC handles when the trainer's tensors are on the servers' GPU); each engine checks
  the names and shapes and loads it with ``/update_weights_from_tensor``.
- ``sglang-distributed`` (disaggregate): a ``torch.distributed`` group of the trainer (rank 0)
  and every server's ranks, made with ``/init_weights_update_group`` (gloo on CPU, NCCL on GPU,
  ``--sglang-update-backend``) and remade when a server was restarted; per bucket, the engines
  post ``/update_weights_from_distributed`` with the bucket's names, dtypes and shapes while the
  trainer broadcasts it (one flattened ``uint8`` tensor when every tensor's offset is aligned to
  its dtype, else tensor by tensor).
- ``sglang-disk``: the ``disk`` sync (:mod:`plasmid_torch.disk_sync`, also plasmid-sync's ``disk``; its
  errors name ``sglang-disk``): the trainer writes ``<--sync-dir>/v{version}``, and since the engine has
  ``load_weights_from_disk`` each server loads it with ``/update_weights_from_disk``; restarted servers
  reload it by path.

Checks of ``sglang-tensor`` and ``sglang-distributed`` (:mod:`plasmid_torch.sync_guard`): each phase runs
under ``--sync-timeout``: the trainer packing or describing a bucket (``gather``), forming the group
(``connect``), broadcasting (``send``), each engine's HTTP call that makes its servers load a bucket
(``load``) and its cache flush (``resume``); past it, one :class:`~plasmid_torch.sync_guard.SyncTimeout`
names the transport, phase, engine and rank. With ``--sync-checksums on``, after each bucket every
engine reports CRC32s of a sample of the bucket as its servers hold it (read through
``/get_weights_by_name``, :meth:`plasmid_sglang.engine.SGLangEngine.loaded_checksums`), compared with
the trainer's (:meth:`~plasmid_torch.sync_guard.SyncGuard.check_loaded`; counted as
``sync/loaded_checksums``); an engine whose model class cannot read back is not checked this way
(the probe of ``--verify-sync-every`` covers it). ``sglang-disk`` has the same loaded checksums
(:class:`plasmid_torch.disk_sync.DiskSync`).

Every ``--verify-sync-every``-th sync of ``sglang-tensor`` and ``sglang-distributed`` ends with
:meth:`plasmid_torch.sync_guard.SyncGuard.verify`: tensors read back through
``/get_weights_by_name`` where the served model class has it, else the scored probe (SGLang's
``response_logprobs`` against the trainer's ``logprobs``), its metrics added to the report.

Every sync flushes the engines' prefix caches afterwards and reports the exported tensors' bytes
and the number of buckets; ``sglang-tensor`` and ``sglang-distributed`` also report the metrics
``sync/buckets`` and ``sync/tensors`` (the exported tensors), and ``sglang-tensor`` adds
``sync/handles``, the tensors its payloads carried: one per bucket (one CUDA IPC handle per
bucket under ``cuda-ipc``), however many tensors the bucket packs.
"""

from __future__ import annotations

import asyncio
import datetime
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

from plasmid.config import Config
from plasmid.kernel_options import ScheduleOptions
from plasmid.options import Options
from plasmid.remote import run_on
from plasmid.types import SyncReport
from plasmid_sglang.options import SGLangOptions
from plasmid_sglang.weights import choose_transport, flattened_bucket, serialize_counted
from plasmid_torch.disk_sync import DiskSync
from plasmid_torch.sync_guard import SyncGuard, SyncGuardOptions, loaded_sample, loaded_seed
from plasmid_torch.tensors import PROCESS_STATE, GroupCycle, group_backend, node_address, process_token, tensor_bytes


def _report(started: float, moved: int, buckets: int, weight_version: int, tensors: int,
            checked: dict[str, float] | None = None, **metrics: float) -> SyncReport:
    """The sync's report; ``checked`` is :meth:`SyncGuard.verify`'s metrics (already ``sync/``-named)."""
    return SyncReport(bytes=moved, seconds=time.perf_counter() - started, weight_version=weight_version,
                      buckets=buckets, metrics={"sync/buckets": float(buckets), "sync/tensors": float(tensors),
                                                **{f"sync/{key}": value for key, value in metrics.items()},
                                                **(checked or {})})


# ================================================================================================ sglang-tensor
class SGLangDiskSync(DiskSync):
    """``sglang-disk``: the ``disk`` sync (:mod:`plasmid_torch.disk_sync`; the engine's
    ``/update_weights_from_disk``), named ``sglang-disk`` in its errors."""

    transport = "sglang-disk"


class TensorSync:
    """Trainer buckets packed into SGLang flattened buckets, through /update_weights_from_tensor
    (colocate); built as ``TensorSync(config)``."""

    option_classes: ClassVar[tuple[type[Options], ...]] = (SGLangOptions, ScheduleOptions, SyncGuardOptions)

    def __init__(self, config: Config) -> None:
        self.bucket_bytes = ScheduleOptions.of(config).update_weight_buffer_size
        self.transport: str = SGLangOptions.of(config).sglang_tensor_transport
        self.key = f"sglang-tensor-{uuid.uuid4().hex}"
        self.guard = SyncGuard(config, "sglang-tensor")

    async def sync(self, trainer: Any, engines: Sequence[Any], weight_version: int) -> SyncReport:
        started, moved, buckets, tensors, handles, loaded = time.perf_counter(), 0, 0, 0, 0, 0
        guard = self.guard
        await guard.phase(run_on(trainer, start_export, self.key, self.bucket_bytes), "gather", trainer, None, 0)
        ended = False
        try:
            while (packed := await guard.phase(
                    run_on(trainer, pack_next_bucket, self.key, self.transport,
                           loaded_seed(weight_version, buckets) if guard.checksums else None),
                    "gather", trainer, None, self.bucket_bytes)) is not None:
                description, payload, transport, nbytes, carried, sample = packed
                await guard.each_engine("load", engines, lambda engine, _index, described=description, sent=payload,
                                        pickled=transport == "pickle": run_on(
                    engine, load_packed_bucket, described, sent, weight_version, pickled), nbytes)
                loaded += await guard.check_loaded(engines, sample)
                moved, buckets, tensors, handles = moved + nbytes, buckets + 1, tensors + len(description), \
                    handles + carried
            ended = True  # the trainer's side dropped its export with the last bucket
        finally:
            if not ended:
                await guard.phase(run_on(trainer, end_export, self.key), "gather", trainer, None, 0)
        await guard.resume(engines)
        guard.moved(moved)
        checked = await guard.verify(trainer, engines, self.bucket_bytes)
        return _report(started, moved, buckets, weight_version, tensors, handles=float(handles),
                       loaded_checksums=float(loaded), checked=checked)


def start_export(trainer: Any, key: str, bucket_bytes: int) -> None:
    """(trainer) Begin iterating the trainer's weights in buckets, for this sync."""
    PROCESS_STATE[key] = iter(trainer.export_weights(bucket_bytes))
    PROCESS_STATE[key + "/held"] = None


def end_export(trainer: Any, key: str) -> None:
    """(trainer) Drop the iterator and the last bucket kept alive for CUDA IPC: done by the call
    that finds the export ended (every bucket was loaded by then), else by the sync on its way out
    of a failure (a separate call: with the Ray runtime, one that waits for the step snapshot)."""
    PROCESS_STATE.pop(key, None)
    PROCESS_STATE.pop(key + "/held", None)


def _next_bucket(key: str) -> list[tuple[str, Any]] | None:
    buckets: Iterator = PROCESS_STATE[key]
    return next(buckets, None)


def _description(bucket: list[tuple[str, Any]]) -> list[tuple[str, str, list[int]]]:
    return [(name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape)) for name, tensor in bucket]


async def pack_next_bucket(trainer: Any, key: str, transport: str,
                           seed: int | None = None) -> tuple[list, str, str, int, int, list] | None:
    """(trainer) The next bucket as ``(description, payload, transport, bytes, tensors the payload
    carries, loaded sample)``, or ``None`` at the end. The bucket's tensors are packed into one flat
    ``uint8`` buffer on their device, so the payload carries one tensor (one CUDA IPC handle). The
    sample is :func:`~plasmid_torch.sync_guard.loaded_sample` of the bucket with ``seed`` (empty for
    ``None``: checksums off)."""

    def pack() -> tuple[list, str, str, int, int, list] | None:
        import torch

        bucket = _next_bucket(key)
        if bucket is None:
            end_export(trainer, key)
            return None
        tensors = [(name, torch.as_tensor(tensor).detach()) for name, tensor in bucket]
        chosen = choose_transport(transport, [t for _, t in tensors])
        flat = flattened_bucket(tensors)
        PROCESS_STATE[key + "/held"] = flat  # CUDA IPC: the storage must outlive the engines' loads
        nbytes = sum(tensor_bytes(t) for _, t in tensors)
        payload, carried = serialize_counted(flat, chosen)
        sample = [] if seed is None else loaded_sample(tensors, seed)
        return _description(tensors), payload, chosen, nbytes, carried, sample

    return await asyncio.to_thread(pack)


async def load_packed_bucket(engine: Any, description: list[tuple[str, str, list[int]]], payload: str,
                             weight_version: int, restorable: bool) -> None:
    """(engine) Check a packed bucket's names and shapes, and load it into every server."""
    names = engine.check_description(description)
    sent = [name for name, _, _ in description]
    if names != sent:
        raise ValueError(f"sglang-tensor: the served model ties lm_head.weight to model.embed_tokens.weight, and "
                         f"this bucket holds only lm_head.weight ({sent}); export the embedding instead")
    await engine.load_payload(names, payload, weight_version, restorable=restorable)


# ================================================================================================ sglang-distributed
class DistributedSync:
    """Trainer buckets broadcast to the servers in a torch.distributed group, through
    /update_weights_from_distributed (disaggregate); built as ``DistributedSync(config)``."""

    option_classes: ClassVar[tuple[type[Options], ...]] = (SGLangOptions, ScheduleOptions, SyncGuardOptions)

    def __init__(self, config: Config) -> None:
        options = SGLangOptions.of(config)
        self.bucket_bytes = ScheduleOptions.of(config).update_weight_buffer_size
        self.backend: str = options.sglang_update_backend
        self.timeout = options.sglang_update_timeout
        self.key = f"sglang-distributed-{uuid.uuid4().hex[:12]}"
        self.group = GroupCycle(self.key)
        self.guard = SyncGuard(config, "sglang-distributed")

    async def sync(self, trainer: Any, engines: Sequence[Any], weight_version: int) -> SyncReport:
        started, moved, buckets, tensors, loaded = time.perf_counter(), 0, 0, 0, 0
        guard = self.guard
        members = [await guard.phase(run_on(trainer, process_token), "connect", trainer, None, 0),
                   *await guard.each_engine("connect", engines, lambda engine, _index: run_on(engine, engine_member),
                                            0)]
        name = await self.group.ensure(members, lambda new: self._make_group(new, trainer, engines))
        await guard.phase(run_on(trainer, start_export, self.key, self.bucket_bytes), "gather", trainer, None, 0)
        ended = False
        try:
            while (described := await guard.phase(
                    run_on(trainer, describe_next_bucket, self.key,
                           loaded_seed(weight_version, buckets) if guard.checksums else None),
                    "gather", trainer, None, self.bucket_bytes)) is not None:
                description, load_format, nbytes, sample = described
                await guard.each_engine("load", engines, lambda engine, _index, described=description: run_on(
                    engine, check_bucket, described), 0)
                sending = asyncio.ensure_future(guard.phase(run_on(trainer, broadcast_bucket, self.key, name),
                                                            "send", trainer, None, nbytes))
                try:
                    await guard.each_engine("receive", engines, lambda engine, _index, described=description,
                                            layout=load_format: run_on(
                        engine, receive_bucket, name, described, layout, weight_version), nbytes)
                    await sending
                finally:
                    sending.cancel()
                loaded += await guard.check_loaded(engines, sample)
                moved, buckets, tensors = moved + nbytes, buckets + 1, tensors + len(description)
            ended = True  # the trainer's side dropped its export with the last bucket
        finally:
            if not ended:
                await guard.phase(run_on(trainer, end_export, self.key), "gather", trainer, None, 0)
        await guard.resume(engines)
        guard.moved(moved)
        checked = await guard.verify(trainer, engines, self.bucket_bytes)
        return _report(started, moved, buckets, weight_version, tensors, loaded_checksums=float(loaded),
                       checked=checked)

    async def _make_group(self, name: str, trainer: Any, engines: Sequence[Any]) -> None:
        """Form group ``name``, each member's part under the ``connect`` deadline. The trainer waits on
        the servers, so a server that does not join is named, not the trainer: the engines' joins are
        awaited first."""
        guard = self.guard
        ranks = await guard.each_engine("connect", engines, lambda engine, _index: run_on(engine, engine_rank_count),
                                        0)
        world = 1 + sum(ranks)
        host, port, backend = await guard.phase(run_on(trainer, group_address, self.backend), "connect", trainer,
                                                None, 0)
        offsets = [1 + sum(ranks[:i]) for i in range(len(engines))]
        sender = asyncio.ensure_future(guard.phase(
            run_on(trainer, join_as_sender, self.key, name, host, port, world, backend, self.timeout), "connect",
            trainer, None, 0))
        try:
            await guard.each_engine("connect", engines, lambda engine, index: run_on(
                engine, join_as_receiver, host, port, offsets[index], world, name, backend), 0)
            await sender
        finally:
            sender.cancel()


def engine_member(engine: Any) -> str:
    """(engine) Who the engine's servers are: a restarted server (new port) needs a new group."""
    return process_token(engine) + "|" + ",".join(server.url for server in engine.usable_servers())


def engine_rank_count(engine: Any) -> int:
    return engine.rank_count()


def group_address(trainer: Any, backend: str) -> tuple[str, int, str]:
    """(trainer) ``(host, free port, backend)`` for the group's rendezvous, served by rank 0."""
    from plasmid_sglang.server import free_port

    host = node_address()
    return host, free_port("0.0.0.0" if host != "127.0.0.1" else host), group_backend(backend)


async def join_as_sender(trainer: Any, key: str, name: str, host: str, port: int, world: int, backend: str,
                         timeout: float) -> None:
    """(trainer) Join group ``name`` as rank 0 (blocks until every server joined)."""
    PROCESS_STATE[key + "/group"] = await asyncio.to_thread(_join_rank0, name, host, port, world, backend, timeout)
    PROCESS_STATE[key + "/backend"] = backend


def _join_rank0(name: str, host: str, port: int, world: int, backend: str, timeout: float) -> Any:
    """The trainer's side of SGLang's ``init_custom_process_group``: rank 0 serves the TCP store
    at ``host:port``; the group's store is prefixed with its name, as on the servers."""
    from torch.distributed.distributed_c10d import Backend, PrefixStore, _new_process_group_helper, _world, rendezvous

    wait = datetime.timedelta(seconds=timeout)
    store, rank, size = next(rendezvous(f"tcp://{host}:{port}", 0, world, timeout=wait))
    store.set_timeout(wait)
    group, _ = _new_process_group_helper(size, rank, [], Backend(backend), PrefixStore(name, store), group_name=name,
                                         timeout=wait)
    _world.pg_group_ranks[group] = {i: i for i in range(size)}
    return group


async def join_as_receiver(engine: Any, host: str, port: int, rank_offset: int, world: int, name: str,
                           backend: str) -> None:
    await engine.join_update_group(host, port, rank_offset, world, name, backend)


async def describe_next_bucket(trainer: Any, key: str, seed: int | None = None) -> tuple[list, str, int, list] | None:
    """(trainer) Take the next bucket; ``(description, load format, bytes, loaded sample)``, or ``None``
    at the end. ``flattened_bucket`` when every tensor's byte offset in the concatenation suits its
    dtype. The sample: as in :func:`pack_next_bucket`."""

    def take() -> tuple[list, str, int, list] | None:
        import torch

        bucket = _next_bucket(key)
        if bucket is None:
            end_export(trainer, key)
            return None
        tensors = [(name, torch.as_tensor(tensor).detach().contiguous()) for name, tensor in bucket]
        offset, aligned = 0, True
        for _, tensor in tensors:
            aligned = aligned and offset % tensor.element_size() == 0
            offset += tensor.numel() * tensor.element_size()
        load_format = "flattened_bucket" if aligned else "per_tensor"
        PROCESS_STATE[key + "/held"] = (tensors, load_format)
        return _description(tensors), load_format, offset, [] if seed is None else loaded_sample(tensors, seed)

    return await asyncio.to_thread(take)


async def broadcast_bucket(trainer: Any, key: str, name: str) -> None:
    """(trainer) Broadcast the bucket taken by :func:`describe_next_bucket` from rank 0."""

    def send() -> None:
        import torch
        import torch.distributed as dist

        group = PROCESS_STATE[key + "/group"]
        device = "cuda" if PROCESS_STATE[key + "/backend"] == "nccl" else "cpu"
        held, load_format = PROCESS_STATE[key + "/held"]
        tensors = [tensor.to(device) for _, tensor in held]
        if load_format == "flattened_bucket":
            flat = [t.reshape(-1).view(torch.uint8) for t in tensors]
            dist.broadcast(torch.cat(flat) if len(flat) > 1 else flat[0], src=0, group=group)
        else:
            for tensor in tensors:
                dist.broadcast(tensor, src=0, group=group)

    await asyncio.to_thread(send)


def check_bucket(engine: Any, description: list[tuple[str, str, list[int]]]) -> None:
    """(engine) Refuse a bucket the served model cannot take, before anything is broadcast."""
    names = engine.check_description(description)
    if names != [name for name, _, _ in description]:
        raise ValueError("sglang-distributed: the served model ties lm_head.weight to model.embed_tokens.weight, and "
                         "a bucket holds only lm_head.weight; export the embedding instead")


async def receive_bucket(engine: Any, name: str, description: list[tuple[str, str, list[int]]], load_format: str,
                         weight_version: int) -> None:
    await engine.receive_bucket(name, description, load_format, weight_version)
