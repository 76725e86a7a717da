"""``broadcast``: a ``torch.distributed`` group of trainer rank 0 and every engine.

The group is its own: a rendezvous store made by trainer rank 0 (a ``FileStore`` when the
cluster is on this machine's loopback, else a ``TCPStore`` on its node address and a free port;
see :func:`open_store`) and a ``ProcessGroupGloo`` (``ProcessGroupNCCL`` when ``--broadcast-backend nccl``, or
``auto`` and the trainer sees a GPU) built on it directly in every member, outside the trainers'
default data-parallel world (``torch.distributed.new_group`` can only split one default world;
engines are not in the trainers' one). Rank 0 is the trainer, engine ``i`` is rank ``i + 1``.

Per bucket of ``--update-weight-buffer-size`` bytes, rank 0 broadcasts three messages:

1. a header: int64 ``[2]`` = (bytes of the description, bytes of the data); ``(0, 0)`` ends;
2. the description: JSON ``[[name, dtype, shape, crc32 or null], ...]`` as uint8;
3. the data: every tensor's bytes, concatenated, as one uint8 buffer,

and each engine cuts the buffer back into tensors and loads them. The group is made at the first
sync and remade when its members change (an engine actor was restarted).

Checks (:mod:`plasmid_torch.sync_guard`): forming the group is the ``connect`` phase, the
trainer's broadcasting ``send``, each engine's receiving and loading ``receive``, then ``resume``,
each under ``--sync-timeout``; with ``--sync-checksums on`` the description carries each tensor's
CRC32, which the engine checks before loading the bucket; ``--verify-sync-every`` reads weights back.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from plasmid.config import Config
from plasmid.kernel_options import ScheduleOptions
from plasmid.options import Options
from plasmid.protocols import RolloutEngine, Trainer
from plasmid.remote import run_on
from plasmid.types import SyncReport
from plasmid_sync.options import SyncOptions
from plasmid_torch.sync_guard import SyncGuard, SyncGuardOptions, check_received, checksum, who
from plasmid_torch.tensors import (
    PROCESS_STATE,
    GroupCycle,
    group_backend,
    node_address,
    process_token,
    require_separate_processes,
    tensor_bytes,
)


class BroadcastSync:
    """The ``broadcast`` weight sync; built as ``BroadcastSync(config)``."""

    option_classes: ClassVar[tuple[type[Options], ...]] = (SyncOptions, ScheduleOptions, SyncGuardOptions)

    def __init__(self, config: Config) -> None:
        options = SyncOptions.of(config)
        self.bucket_bytes = ScheduleOptions.of(config).update_weight_buffer_size
        self.backend = options.broadcast_backend
        self.timeout = options.broadcast_timeout
        self.key = f"broadcast-{uuid.uuid4().hex}"
        self.group = GroupCycle(self.key)
        self.guard = SyncGuard(config, "broadcast")

    async def sync(self, trainer: Trainer, engines: Sequence[RolloutEngine], weight_version: int) -> SyncReport:
        require_separate_processes("broadcast", trainer, engines)
        started = time.perf_counter()
        guard = self.guard
        members = [await guard.phase(run_on(trainer, process_token), "connect", trainer, None, 0),
                   *await guard.each_engine("connect", engines, lambda e, _i: run_on(e, process_token), 0)]
        name = await guard.phase(self.group.ensure(members, lambda new: self._make_group(new, trainer, engines)),
                                 "connect", trainer, None, 0)
        sending = asyncio.ensure_future(guard.phase(
            run_on(trainer, send_weights, name, self.bucket_bytes, guard.checksums), "send", trainer))
        try:
            await guard.each_engine("receive", engines, lambda engine, index: run_on(
                engine, receive_weights, name, weight_version, who(engine, index)))
            moved, buckets = await sending
        finally:
            sending.cancel()
        await guard.resume(engines)
        guard.moved(moved)
        metrics = await guard.verify(trainer, engines, self.bucket_bytes)
        return SyncReport(bytes=moved, seconds=time.perf_counter() - started, weight_version=weight_version,
                          buckets=buckets, metrics=metrics)

    async def _make_group(self, name: str, trainer: Trainer, engines: Sequence[RolloutEngine]) -> None:
        world = 1 + len(engines)
        host, port, backend = await run_on(trainer, open_store, name, world, self.backend, self.timeout)
        await asyncio.gather(
            run_on(trainer, join_group, name, self.key, host, port, 0, world, backend, self.timeout),
            *(run_on(engine, join_group, name, self.key, host, port, rank + 1, world, backend, self.timeout)
              for rank, engine in enumerate(engines)))


@dataclass
class Member:
    """This process's membership of one broadcast group."""

    sync_key: str
    group: Any
    store: Any
    device: str


# ------------------------------------------------------------------------------ in the trainer's process
#: ``host`` of a rendezvous held in a file rather than served on a port (see :func:`open_store`).
FILE_STORE = "file:"


def open_store(trainer: Any, name: str, world: int, backend: str, timeout: float) -> tuple[str, int, str]:
    """Create the group's rendezvous store here; ``(host, port, backend)`` for the members.

    On a cluster that lives on this machine's loopback (every member can see this file system,
    and nothing may listen beyond 127.0.0.1) it is a ``FileStore`` in the temporary directory,
    ``host`` being ``"file:" + path``: torch's ``TCPStore`` would listen on every interface.
    Otherwise a ``TCPStore`` served on this node's address and a free port."""
    import tempfile

    import torch.distributed as dist

    host = node_address()
    if host.startswith("127."):
        path = f"{tempfile.gettempdir()}/plasmid-broadcast-{name}"
        PROCESS_STATE[f"{name}/store"] = dist.FileStore(path, world)
        return FILE_STORE + path, 0, group_backend(backend)
    store = dist.TCPStore(host, 0, world, is_master=True, timeout=datetime.timedelta(seconds=timeout),
                          wait_for_workers=False)
    PROCESS_STATE[f"{name}/store"] = store
    return host, int(store.port), group_backend(backend)


async def send_weights(trainer: Any, name: str, bucket_bytes: int, checksums: bool = True) -> tuple[int, int]:
    """Broadcast every bucket of the trainer's weights (with each tensor's CRC32 when ``checksums``),
    then the end mark; ``(bytes, buckets)``."""
    member: Member = PROCESS_STATE[name]
    return await asyncio.to_thread(_send_all, member, trainer.export_weights(bucket_bytes), checksums)


def _send_all(member: Member, buckets: Iterable[list[tuple[str, Any]]], checksums: bool) -> tuple[int, int]:
    import torch

    moved, count = 0, 0
    for bucket in buckets:
        description = [[name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape),
                        checksum(tensor) if checksums else None] for name, tensor in bucket]
        encoded = torch.frombuffer(bytearray(json.dumps(description).encode()), dtype=torch.uint8)
        data = torch.cat([tensor.detach().contiguous().reshape(-1).view(torch.uint8) for _, tensor in bucket])
        _broadcast(member, torch.tensor([encoded.numel(), data.numel()], dtype=torch.int64))
        _broadcast(member, encoded)
        _broadcast(member, data)
        moved += sum(tensor_bytes(tensor) for _, tensor in bucket)
        count += 1
    _broadcast(member, torch.zeros(2, dtype=torch.int64))
    return moved, count


# ------------------------------------------------------------------------------ in every member's process
async def join_group(target: Any, name: str, sync_key: str, host: str, port: int, rank: int, world: int,
                     backend: str, timeout: float) -> None:
    """Join group ``name`` as ``rank`` (blocks until every member joins); this process's older
    groups of the same sync are dropped."""
    await asyncio.to_thread(_join, name, sync_key, host, port, rank, world, backend, timeout)


def _join(name: str, sync_key: str, host: str, port: int, rank: int, world: int, backend: str,
          timeout: float) -> None:
    import torch.distributed as dist

    for old in [k for k, v in PROCESS_STATE.items() if isinstance(v, Member) and v.sync_key == sync_key]:
        del PROCESS_STATE[old]
    wait = datetime.timedelta(seconds=timeout)
    store = PROCESS_STATE.pop(f"{name}/store", None)
    if store is None and host.startswith(FILE_STORE):
        store = dist.FileStore(host.removeprefix(FILE_STORE), world)
    elif store is None:
        store = dist.TCPStore(host, port, world, is_master=False, timeout=wait, wait_for_workers=False)
    prefixed = dist.PrefixStore(name, store)
    if backend == "nccl":
        import torch

        group = dist.ProcessGroupNCCL(prefixed, rank, world, dist.ProcessGroupNCCL.Options())
        device = f"cuda:{torch.cuda.current_device()}"
    else:
        group = dist.ProcessGroupGloo(prefixed, rank, world, wait)
        device = "cpu"
    PROCESS_STATE[name] = Member(sync_key, group, store, device)


# ------------------------------------------------------------------------------ in each engine's process
async def receive_weights(engine: Any, name: str, weight_version: int, receiver: str = "the engine") -> int:
    """Receive buckets until the end mark, checking each against the trainer's CRC32s (where sent;
    ``receiver`` names the engine in the error) and loading it into ``engine``; bytes received."""
    member: Member = PROCESS_STATE[name]
    received = 0
    while (received_bucket := await asyncio.to_thread(_receive_bucket, member)) is not None:
        bucket, checksums = received_bucket
        check_received(bucket, None if None in checksums else checksums, "broadcast", receiver)
        await engine.update_weights(bucket, weight_version)
        received += sum(tensor_bytes(tensor) for _, tensor in bucket)
    return received


def _receive_bucket(member: Member) -> tuple[list[tuple[str, Any]], list[int | None]] | None:
    """The next bucket and the CRC32 the trainer sent for each tensor (``None``: none sent);
    ``None`` at the end mark."""
    import torch

    header = _broadcast(member, torch.zeros(2, dtype=torch.int64))
    description_bytes, data_bytes = (int(v) for v in header.cpu())
    if description_bytes == 0:
        return None
    encoded = _broadcast(member, torch.empty(description_bytes, dtype=torch.uint8))
    data = _broadcast(member, torch.empty(data_bytes, dtype=torch.uint8))
    description = json.loads(bytes(encoded.cpu().numpy()).decode())
    bucket, offset = [], 0
    for tensor_name, dtype_name, shape, _crc in description:
        dtype = getattr(torch, dtype_name)
        count = int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
        bucket.append((tensor_name, data[offset: offset + count].view(dtype).reshape(shape)))
        offset += count
    return bucket, [crc for *_, crc in description]


def _broadcast(member: Member, tensor: Any) -> Any:
    """Broadcast ``tensor`` from rank 0 in ``member``'s group (on its device); the result."""
    on_device = tensor.to(member.device)
    member.group.broadcast(on_device, 0).wait()
    return on_device
