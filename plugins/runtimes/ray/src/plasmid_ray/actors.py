"""What runs inside the actors: an engine host and a trainer worker.

Both are plain classes, made Ray actors by the runtime (``ray.remote(Class).options(...)``), and
both are *async* actors: calls run concurrently on one event loop, so an engine batches the
requests of many callers, and a trainer answers a weight-sync call while it waits on a thread.

Every actor first loads exactly the driver's plugin lock (:func:`plasmid.providers.lock_registry`),
which fails, naming the package, when this process has other versions installed; only then does
it build its provider from it (:func:`plasmid.providers.build`), as the local runtime would.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from plasmid import providers
from plasmid.config import Config
from plasmid.protocols import RolloutEngine, SupportsValues, Trainer
from plasmid.remote import run_on
from plasmid_ray.snapshots import read_tree, snapshot_base, snapshot_dir


def is_collective(trainer: Trainer) -> bool:
    """Whether ``trainer`` is *collective*: its class sets ``collective = True`` (weights sharded
    over the ranks, see :class:`plasmid.protocols.Trainer`); rank-0 reads otherwise."""
    return bool(getattr(type(trainer), "collective", False))


def limit_threads(cpus: float) -> int:
    """Use as many math threads as CPUs reserved (at least one); returns the count."""
    import torch

    threads = max(1, int(cpus))
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    return threads


def describe_process() -> dict[str, Any]:
    """Node IP, process id and visible GPUs of this actor (for logs and placement checks)."""
    import ray

    return {"node_ip": ray.util.get_node_ip_address(), "pid": os.getpid(),
            "gpu_ids": [int(g) for g in ray.get_gpu_ids()]}


class EngineHost:
    """One rollout engine (``--engine``), built from the registry inside this actor.

    Methods mirror :class:`plasmid.protocols.RolloutEngine`; ``call`` runs a function on the
    engine (``plasmid.remote.run_on``) and returns its result with the engine's weight version.
    """

    def __init__(self, config: Config, index: int, cpus: float) -> None:
        self.index = index
        limit_threads(cpus)
        self.engine: RolloutEngine = providers.build("engine", config.option.engine, config)

    async def ready(self) -> dict[str, Any]:
        return {**describe_process(), "weight_version": self.engine.weight_version}

    async def generate(self, prompt_ids: list[int], params: Any) -> Any:
        return await self.engine.generate(prompt_ids, params)

    async def response_logprobs(self, token_ids: list[int], prompt_length: int, temperature: float) -> list[float]:
        return await self.engine.response_logprobs(token_ids, prompt_length, temperature)

    async def abort_all(self) -> int:
        return await self.engine.abort_all()

    async def update_weights(self, named_tensors: list[tuple[str, Any]], weight_version: int) -> int:
        await self.engine.update_weights(named_tensors, weight_version)
        return self.engine.weight_version

    async def get_weights(self, names: list[str]) -> dict[str, Any]:
        return await self.engine.get_weights(names)

    async def weight_version(self) -> int:
        return self.engine.weight_version

    async def flush_cache(self) -> None:
        await self.engine.flush_cache()

    async def release_memory(self) -> None:
        await self.engine.release_memory()

    async def resume_memory(self) -> None:
        await self.engine.resume_memory()

    async def shutdown(self) -> None:
        await self.engine.shutdown()

    async def call(self, fn: Callable[..., Any], args: tuple) -> tuple[Any, int]:
        result = await run_on(self.engine, fn, *args)
        return result, self.engine.weight_version


class TrainerWorker:
    """Rank ``rank`` of ``world`` trainer workers.

    :meth:`setup` joins the ``torch.distributed`` group of the trainers (gloo on CPU, NCCL when
    a GPU is visible; rank 0's store, from :meth:`rendezvous`) and builds the loss and
    the trainer from the registry. The trainer plugin sees an initialised default process group
    and trains its shard (see plasmid-torchtrain's ``distributed`` module). Calls that touch the
    weights are serialised by a lock, so a weight export never reads a half-applied update.

    A *collective* trainer (``collective = True``, see :class:`plasmid.protocols.Trainer`) needs
    every rank in every export: rank 0 is then given the other workers (:meth:`lead`), and each
    time a function run on it (:meth:`call`, :meth:`export_buckets`) starts an export, the others
    run the same export alongside (:meth:`follow_export`) and drop what it yields.
    """

    def __init__(self, config: Config, rank: int, world: int, cpus: float) -> None:
        self.config, self.rank, self.world = config, rank, world
        limit_threads(cpus)
        self.registry = providers.lock_registry(config)
        self.trainer: Trainer | None = None
        self.followers: list[Any] = []
        self.lock = asyncio.Lock()
        #: this worker's weight exports begun and not ended (an export a weight sync reads one
        #: bucket per :meth:`call` stays open between its calls, with the lock released)
        self.open_exports = 0
        #: whether an export ended whole since the last train step (see :meth:`call`)
        self.weights_read = False

    async def ready(self) -> dict[str, Any]:
        return describe_process()

    async def rendezvous(self, token: str) -> str:
        """The ``init_method`` of the trainers' process group (asked of rank 0): on a node whose
        Ray address is the loopback one (a local cluster, every rank on this machine), a file
        store named by ``token`` in this machine's temp directory (a TCP store would listen on
        every interface); else ``tcp://`` this node's IP and a port free on it."""
        import tempfile

        from plasmid_ray.cluster import free_port, is_loopback, node_address

        address = node_address()
        if is_loopback(address):
            return f"file://{tempfile.gettempdir()}/plasmid-trainers-{token}"
        return f"tcp://{address}:{free_port()}"

    async def setup(self, init_method: str) -> dict[str, Any]:
        """Join the group (``init_method`` from rank 0's :meth:`rendezvous`), build the trainer;
        this process's description and whether the trainer is collective."""
        if self.world > 1:
            await asyncio.to_thread(self._join_group, init_method)
        choice = self.config.option  # provider choices
        loss = providers.build("loss", choice.loss, self.config, registry=self.registry)
        self.trainer = providers.build("trainer", choice.trainer, self.config, loss, registry=self.registry)
        return {**describe_process(), "collective": is_collective(self.trainer), "snapshot_base": snapshot_base()}

    def _join_group(self, init_method: str) -> None:
        import datetime

        import torch
        import torch.distributed as dist

        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend=backend, init_method=init_method, rank=self.rank, world_size=self.world,
                                timeout=datetime.timedelta(minutes=30))

    async def lead(self, followers: list[Any]) -> None:
        """Make this worker (rank 0 of a collective trainer) start ``followers``' exports with its own."""
        self.followers = list(followers)

    async def train_step(self, batch: Any) -> dict[str, float]:
        async with self.lock:
            self.weights_read = False
            return await self.trainer.train_step(batch)

    async def logprobs(self, samples: list[Any], temperature: float) -> list[list[float]]:
        async with self.lock:
            return await self.trainer.logprobs(samples, temperature)

    async def values(self, samples: list[Any]) -> list[list[float]]:
        trainer = self.trainer
        if not isinstance(trainer, SupportsValues):
            raise TypeError(f"trainer {type(trainer).__name__} has no values(samples) (plasmid.protocols."
                            f"SupportsValues): the loss needs a critic, which this trainer does not train")
        async with self.lock:
            return await trainer.values(samples)

    async def export_buckets(self, bucket_bytes: int) -> AsyncIterator[list[tuple[str, Any]]]:
        """The trainer's ``export_weights`` buckets as numpy arrays, one Ray object per bucket
        (a streaming generator: at most a few buckets are alive at a time)."""
        async with self.lock:
            for bucket in self._led().export_weights(bucket_bytes):
                yield [(name, _as_numpy(tensor)) for name, tensor in bucket]

    async def follow_export(self, bucket_bytes: int) -> int:
        """Take part in an export that rank 0 leads (collective trainers); the tensors exported."""
        def drain() -> int:
            return sum(len(bucket) for bucket in self.trainer.export_weights(bucket_bytes))

        async with self.lock:
            return await asyncio.to_thread(drain)

    async def save(self, path: str) -> None:
        async with self.lock:
            await self.trainer.save(path)

    async def snapshot(self, base: str, token: str, read: bool) -> tuple[dict[str, bytes], tuple[int, float]]:
        """The trainer's ``save`` into snapshot ``token``'s directory under ``base`` (a collective
        call on a collective trainer); when ``read`` (rank 0), its files read back and the directory
        deleted: ``({relative path: bytes}, (their bytes, seconds))``, else ``({}, (0, seconds))``
        (see :mod:`plasmid_ray.snapshots`). Called with ``num_returns=2``, so the driver can learn
        the size and time without fetching the files."""
        root = snapshot_dir(base, token)
        async with self.lock:
            began = time.perf_counter()
            try:
                await self.trainer.save(str(root / "trainer"))
                files = await asyncio.to_thread(read_tree, root / "trainer") if read else {}
            finally:
                if read:
                    await asyncio.to_thread(shutil.rmtree, root, True)
        return files, (sum(len(data) for data in files.values()), time.perf_counter() - began)

    async def load(self, path: str) -> None:
        async with self.lock:
            await self.trainer.load(path)

    async def offload(self) -> None:
        await self.trainer.offload()

    async def onload(self) -> None:
        await self.trainer.onload()

    async def call(self, fn: Callable[..., Any], args: tuple) -> tuple[Any, bool]:
        """``fn(trainer, *args)`` in this process, and whether the weights of the last train step
        have been read whole since it (an export ended, none open): the driver starts the step
        snapshot only then, since a collective save must never run beside an open export."""
        async with self.lock:
            result = await run_on(self._led(), fn, *args)
            return result, self.open_exports == 0 and self.weights_read

    async def shutdown(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()

    def _led(self) -> Any:
        """The trainer as functions run on this worker see it (:class:`LeadingTrainer`)."""
        return LeadingTrainer(self.trainer, self.followers, self)


class LeadingTrainer:
    """The trainer of ``worker``, whose :meth:`export_weights` is counted in the worker's
    ``open_exports``/``weights_read`` and, on rank 0 of a collective trainer (``followers``: the
    other ranks), first starts the same export on the followers and after its last bucket waits
    for theirs to end (so a follower's failure is this export's failure). Every other attribute
    is the trainer's, set ones included (a function run on the worker may keep state there)."""

    def __init__(self, trainer: Any, followers: list[Any], worker: TrainerWorker) -> None:
        object.__setattr__(self, "_trainer", trainer)
        object.__setattr__(self, "_followers", followers)
        object.__setattr__(self, "_worker", worker)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._trainer, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._trainer, name, value)

    def export_weights(self, bucket_bytes: int) -> Iterator[Any]:
        import ray

        self._worker.open_exports += 1
        try:
            following = [follower.follow_export.remote(bucket_bytes) for follower in self._followers]
            yield from self._trainer.export_weights(bucket_bytes)
            ray.get(following)
            self._worker.weights_read = True
        finally:
            self._worker.open_exports -= 1


def _as_numpy(tensor: Any) -> Any:
    """A numpy copy of a torch tensor (zero-copy in Ray's object store); dtypes numpy lacks
    (bfloat16) stay torch tensors, which Ray pickles."""
    if not hasattr(tensor, "detach"):
        return tensor
    try:
        return tensor.detach().cpu().numpy()
    except TypeError:
        return tensor.detach().cpu()
