"""``--weight-sync vllm-nccl``: the trainer's weights broadcast over NCCL into vLLM servers on
other GPUs (disaggregated placement), with vLLM's own RL weight-transfer engine
(``vllm.distributed.weight_transfer.nccl_engine``). GPU only: written against vllm 0.32.0 and
not run on this project's CPU machines (NCCL needs CUDA); its test is skipped without a GPU.

How it runs:

- the servers are started with ``--vllm-weight-transfer-config '{"backend": "nccl"}'`` (the
  user gives it; the sync refuses to start without a GPU on the trainer's side);
- first sync: in the trainer's process (:func:`plasmid.remote.run_on`),
  ``NCCLTrainerWeightTransferEngine.trainer_init`` opens rank 0 of a group of the trainer and
  every server's workers; each server joins through ``/init_weight_transfer_engine`` with its own
  ``rank_offset`` (servers after each other, ``/get_world_size`` ranks each);
- every sync: ``/start_weight_update``, then ``/update_weights`` (names, dtypes, shapes) on
  every server while the trainer broadcasts the tensors (vLLM packs them into buffers of
  ``--update-weight-buffer-size`` bytes), then ``/finish_weight_update`` with the version; the
  engines reset their prefix caches and record the version.

Checks (:mod:`plasmid_torch.sync_guard`): asking the engines for their servers is the ``connect``
phase, the trainer's whole broadcast (``/start_weight_update`` to ``/finish_weight_update``) the
``send`` phase, the engines' cache reset ``resume``, each under ``--sync-timeout`` with one error naming
the transport, phase, engine or trainer and rank. With ``--sync-checksums on`` every engine then
reports CRC32s of a sample of every bucket as its workers hold it (plasmid's worker extension,
:meth:`plasmid_vllm.engine.VLLMEngine.loaded_checksums`), compared with the trainer's (``sync/loaded_checksums``).

Every ``--verify-sync-every``-th sync ends with :meth:`plasmid_torch.sync_guard.SyncGuard.verify`:
tensors read back through plasmid's worker extension, or, for servers launched without it, the
scored probe; its metrics are the report's.

Trainer weights are the trainer's ``export_weights`` (Hugging Face names). A server restarted by
the health monitor cannot be given weights that came this way (the engine says so).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

from plasmid.config import Config
from plasmid.errors import UsageError
from plasmid.kernel_options import ScheduleOptions
from plasmid.options import Options
from plasmid.remote import run_on
from plasmid.types import SyncReport
from plasmid_serving.server_process import free_port
from plasmid_torch.disk_sync import DiskSync
from plasmid_torch.sync_guard import SyncGuard, SyncGuardOptions, export_loaded_sample, reports_loaded
from plasmid_torch.tensors import PROCESS_STATE, node_address, tensor_bytes
from plasmid_vllm.options import VLLMOptions


class VLLMDiskSync(DiskSync):
    """``vllm-disk``: the ``disk`` sync (:mod:`plasmid_torch.disk_sync`; the engine's
    ``load_weights_from_disk``), named ``vllm-disk`` in its errors."""

    transport = "vllm-disk"


class NCCLSync:
    """NCCL broadcast through vLLM's weight-transfer API; built as ``NCCLSync(config)``."""

    option_classes: ClassVar[tuple[type[Options], ...]] = (VLLMOptions, ScheduleOptions, SyncGuardOptions)

    def __init__(self, config: Config) -> None:
        self.bucket_bytes = ScheduleOptions.of(config).update_weight_buffer_size
        self.timeout = VLLMOptions.of(config).vllm_update_timeout
        self.key = f"vllm-nccl-{uuid.uuid4().hex}"
        self.guard = SyncGuard(config, "vllm-nccl")

    async def sync(self, trainer: Any, engines: Sequence[Any], weight_version: int) -> SyncReport:
        started, guard = time.perf_counter(), self.guard
        urls = [url for per_engine in await guard.each_engine("connect", engines, lambda engine, _index: run_on(
            engine, server_urls), 0) for url in per_engine]
        moved, buckets = await guard.phase(run_on(trainer, send_over_nccl, self.key, urls, self.bucket_bytes,
                                                  self.timeout, weight_version), "send", trainer)
        guard.moved(moved)
        await guard.each_engine("resume", engines, lambda engine, _index: run_on(
            engine, note_external_update, weight_version, "vllm-nccl"), 0)
        loaded = 0
        if guard.checksums and any(await guard.each_engine("load", engines, lambda engine, _index: run_on(
                engine, reports_loaded), 0)):
            sample = await guard.phase(run_on(trainer, export_loaded_sample, self.bucket_bytes, weight_version),
                                       "gather", trainer)
            loaded = await guard.check_loaded(engines, sample)
        checked = await guard.verify(trainer, engines, self.bucket_bytes)
        if loaded:
            checked["sync/loaded_checksums"] = float(loaded)
        return SyncReport(bytes=moved, seconds=time.perf_counter() - started, weight_version=weight_version,
                          buckets=buckets, metrics=checked)


def server_urls(engine: Any) -> list[str]:
    """(engine) The URLs of the engine's servers in service."""
    return [server.url for server in engine.servers if server.failure is None]


async def note_external_update(engine: Any, weight_version: int, how: str) -> None:
    """(engine) Weights arrived outside the engine: reset the caches, record the version."""
    await engine.note_external_update(weight_version, how)


class _FanOutClient:
    """vLLM's ``VLLMWeightSyncClient`` over several servers: each call goes to every server (the
    init call with each server's own ``rank_offset``)."""

    def __init__(self, urls: list[str], timeout: float) -> None:
        from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient

        self.clients = [HTTPVLLMWeightSyncClient(url, timeout=timeout) for url in urls]
        self.world_sizes = [_world_size(url) for url in urls]
        self.pool = ThreadPoolExecutor(max_workers=max(1, len(urls)))

    def _all(self, call: Any) -> None:
        for future in [self.pool.submit(call, index, client) for index, client in enumerate(self.clients)]:
            future.result()

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        def init(index: int, client: Any) -> None:
            client.init_weight_transfer_engine({**init_info, "rank_offset": 1 + sum(self.world_sizes[:index])})

        self._all(init)

    def shutdown_weight_transfer_engine(self) -> None:
        self._all(lambda _, client: client.shutdown_weight_transfer_engine())

    def start_weight_update(self) -> None:
        self._all(lambda _, client: client.start_weight_update())

    def update_weights(self, update_info: Any) -> None:
        self._all(lambda _, client: client.update_weights(update_info))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._all(lambda _, client: client.finish_weight_update(weight_version))


def _world_size(url: str) -> int:
    import json
    import urllib.request

    with urllib.request.urlopen(url + "/get_world_size?include_dp=false", timeout=60) as response:
        return int(json.loads(response.read())["world_size"])


def send_over_nccl(trainer: Any, key: str, urls: list[str], bucket_bytes: int, timeout: float,
                   weight_version: int) -> tuple[int, int]:
    """(trainer) Broadcast the trainer's exported weights to the servers at ``urls``; ``(bytes, buckets)``."""
    import torch
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo, NCCLTrainerWeightTransferEngine

    if not torch.cuda.is_available():
        raise UsageError("--weight-sync vllm-nccl broadcasts over NCCL and needs a GPU in the trainer's process; "
                         "use vllm-disk or inprocess on CPU")

    class ExportSource(WeightSource):
        def metadata(self) -> list[ParamMeta]:
            return [ParamMeta(name, tensor.dtype, tuple(tensor.shape))
                    for bucket in trainer.export_weights(bucket_bytes) for name, tensor in bucket]

        def __iter__(self) -> Any:
            for bucket in trainer.export_weights(bucket_bytes):
                for name, tensor in bucket:
                    yield name, tensor.cuda()

    state = PROCESS_STATE.get(key)
    if state is None or state["urls"] != urls:
        client = _FanOutClient(urls, timeout)
        info = NCCLTrainerInitInfo(master_address=node_address(), master_port=free_port(""),
                                   world_size=1 + sum(client.world_sizes), packed_buffer_size_bytes=bucket_bytes)
        engine = NCCLTrainerWeightTransferEngine.trainer_init(info, client=client, source=ExportSource())
        state = PROCESS_STATE[key] = {"urls": urls, "engine": engine, "client": client}
    state["engine"].send_weights()
    state["client"].finish_weight_update(str(weight_version))
    buckets = list(trainer.export_weights(bucket_bytes))
    return sum(tensor_bytes(t) for bucket in buckets for _, t in bucket), len(buckets)
