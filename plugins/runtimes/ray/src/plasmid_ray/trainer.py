"""The trainer workers and the driver-side :class:`TrainerProxy` over them.

Collective calls (``train_step``, ``load``, ``offload``/``onload``) go to every rank with the
same arguments (the batch is put in the object store once) and return rank 0's result: the
trainer plugin all-reduces gradients and metrics, so rank 0's metrics are the global ones.
Calls that read the (identical) weights of one rank go to rank 0: ``logprobs``, ``values``,
``save``, ``export_weights`` and ``plasmid_call`` (a weight sync's trainer-side step).

A *collective* trainer (``collective = True``: its weights are sharded over the ranks, as
megatron's are) gets every call on every rank instead: ``logprobs``, ``values`` and ``save`` go
to all ranks (rank 0's result is used), and an export on rank 0, whether the driver streams it
or a weight sync's function starts it there, runs on the other ranks alongside
(:class:`plasmid_ray.actors.LeadingTrainer`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

from plasmid.config import Config
from plasmid.types import RolloutBatch, Sample
from plasmid_ray.actors import TrainerWorker
from plasmid_ray.engines import report, wait_ready
from plasmid_ray.placement import Placement


class TrainerProxy:
    """:class:`plasmid.protocols.Trainer` over ``--trainer-workers`` :class:`TrainerWorker` actors."""

    def __init__(self, workers: list[Any], infos: list[dict[str, Any]]) -> None:
        self.workers, self.infos = workers, infos
        #: whether every call must reach every rank (see the module docstring)
        self.collective = bool(infos and infos[0].get("collective"))

    @property
    def rank0(self) -> Any:
        return self.workers[0]

    async def _read(self, method: str, *args: Any) -> Any:
        """Rank 0's answer to ``method``; asked of every rank when the trainer is collective."""
        import ray

        if not self.collective:
            return await getattr(self.rank0, method).remote(*args)
        shared = [ray.put(arg) for arg in args]
        results = await asyncio.gather(*(getattr(worker, method).remote(*shared) for worker in self.workers))
        return results[0]

    async def logprobs(self, samples: list[Sample], temperature: float) -> list[list[float]]:
        return await self._read("logprobs", samples, temperature)

    async def values(self, samples: list[Sample]) -> list[list[float]]:
        """The critic's values (trainers whose loss needs a critic), from rank 0."""
        return await self._read("values", samples)

    async def train_step(self, batch: RolloutBatch) -> dict[str, float]:
        import ray

        shared = ray.put(batch)
        results = await asyncio.gather(*(worker.train_step.remote(shared) for worker in self.workers))
        return results[0]

    def export_weights(self, bucket_bytes: int) -> Iterator[list[tuple[str, Any]]]:
        """Rank 0's buckets, fetched one at a time into this process (numpy arrays). Blocking:
        a sync that runs in the driver (``inprocess``) uses it; the Ray-native syncs move
        weights between the actors instead (``objectstore``, ``broadcast``)."""
        import ray

        for ref in self.rank0.export_buckets.remote(bucket_bytes):
            yield ray.get(ref)

    async def save(self, path: str) -> None:
        await self._read("save", path)

    async def load(self, path: str) -> None:
        await asyncio.gather(*(worker.load.remote(path) for worker in self.workers))

    async def offload(self) -> None:
        await asyncio.gather(*(worker.offload.remote() for worker in self.workers))

    async def onload(self) -> None:
        await asyncio.gather(*(worker.onload.remote() for worker in self.workers))

    async def plasmid_call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(trainer, *args)`` on rank 0 (see :func:`plasmid.remote.run_on`)."""
        return await self.rank0.call.remote(fn, args)

    async def plasmid_call_all(self, fn: Callable[..., Any], *args: Any) -> list[Any]:
        """``fn(trainer, *args)`` on every rank at once; the results in rank order."""
        return list(await asyncio.gather(*(worker.call.remote(fn, args) for worker in self.workers)))

    async def shutdown(self) -> None:
        import ray

        try:
            await asyncio.gather(*(worker.shutdown.remote() for worker in self.workers))
        except ray.exceptions.RayError:
            pass
        for worker in self.workers:
            ray.kill(worker, no_restart=True)


async def start_trainers(config: Config, placement: Placement) -> TrainerProxy:
    """Create the trainer workers in their bundles, join them in one process group (rank 0's
    node address and a free port there), build each rank's trainer; the proxy over them."""
    import ray

    world = len(placement.trainer_bundles)
    resources = placement.trainer
    workers = []
    for rank, bundle in enumerate(placement.trainer_bundles):
        options = {**resources.as_options(), **placement.scheduling(bundle), "max_concurrency": 64, "max_restarts": 0}
        workers.append(ray.remote(TrainerWorker).options(**options).remote(config, rank, world, resources.cpus))
    try:
        await asyncio.gather(*(wait_ready(worker, f"trainer worker {rank}") for rank, worker in enumerate(workers)))
        address, port = await workers[0].rendezvous_address.remote()
        infos = await asyncio.gather(*(worker.setup.remote(address, port) for worker in workers))
    except BaseException:
        for worker in workers:
            ray.kill(worker, no_restart=True)
        raise
    proxy = TrainerProxy(workers, list(infos))
    if proxy.collective and world > 1:
        await workers[0].lead.remote(workers[1:])
    if world > 1:
        kind = "collective" if proxy.collective else "rank-0 reads"
        report(f"{world} trainer workers joined one process group at {address}:{port} ({kind})")
    return proxy
