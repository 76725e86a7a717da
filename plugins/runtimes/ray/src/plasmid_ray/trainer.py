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

A dead trainer worker (killed, crashed, its node lost) is not restarted: the other ranks' state
went on without it. Any call that needs it raises one :class:`~plasmid.errors.ProviderError`
naming the rank, its pid, the trainer provider and its plugin, the last complete checkpoint and
``--resume``. What can still be read stays readable: with rank-0 reads and rank 0 alive,
``save``, ``logprobs``, ``values`` and exports work (so the run may checkpoint), unless a train
step failed or was cut short by the death, after which rank 0's state is that of an unfinished
step and ``save`` refuses, naming why. A refused ``save`` writes nothing, so the checkpoint being
written stays ``.partial`` and the last complete one stands (:mod:`plasmid.checkpoint`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

from plasmid.checkpoint import Checkpoints
from plasmid.config import Config
from plasmid.errors import ProviderError
from plasmid.types import RolloutBatch, Sample
from plasmid_ray.actors import TrainerWorker
from plasmid_ray.deaths import classify, oom_kills, oom_kills_since
from plasmid_ray.engines import report, wait_ready
from plasmid_ray.placement import Placement

#: Seconds a live worker has to answer the liveness probe after another call failed.
PROBE_SECONDS = 10.0
#: Seconds the workers get to leave their process group at shutdown before they are killed.
SHUTDOWN_SECONDS = 10.0


class TrainerProxy:
    """:class:`plasmid.protocols.Trainer` over ``--trainer-workers`` :class:`TrainerWorker` actors.

    :ivar dead: rank -> the error line of each worker found dead (see the module docstring).
    """

    def __init__(self, workers: list[Any], infos: list[dict[str, Any]], *, trainer: str = "trainer",
                 provider: str = "", plugin: str = "", run_dir: str | None = None) -> None:
        self.workers, self.infos = workers, infos
        #: whether every call must reach every rank (see the module docstring)
        self.collective = bool(infos and infos[0].get("collective"))
        #: how errors name the trainer: "trainer 'torchtrain' from plugin plasmid-torchtrain 0.1.0"
        self.trainer, self.provider, self.plugin, self.run_dir = trainer, provider, plugin, run_dir
        self.dead: dict[int, str] = {}
        #: why rank 0's state may be half-updated (a train step failed or was cut short), if so
        self.torn: str | None = None
        #: the kernel's OOM kill count when the workers started (see :func:`plasmid_ray.deaths.classify`)
        self.oom_base = oom_kills()

    @property
    def rank0(self) -> Any:
        return self.workers[0]

    # ------------------------------------------------------------------------ faults
    def death_cause(self, exc: BaseException) -> str:
        """One line saying why a worker died (:func:`plasmid_ray.deaths.classify`)."""
        return classify(exc, oom_kills_since(self.oom_base)).cause

    def _died(self, rank: int, method: str, cause: str) -> ProviderError:
        """The one-line error for rank ``rank`` dead during ``method`` (recorded in ``dead``)."""
        if rank not in self.dead:
            pid = self.infos[rank].get("pid", "?") if rank < len(self.infos) else "?"
            self.dead[rank] = (f"trainer worker rank {rank} of {len(self.workers)} (pid {pid}) of {self.trainer} "
                               f"died during {method}: {cause}")
        return ProviderError(f"{self.dead[rank]}; the run cannot go on without it. {self._resume_hint()}",
                             provider=self.provider, plugin=self.plugin)

    def _resume_hint(self) -> str:
        latest = Checkpoints(self.run_dir).latest() if self.run_dir is not None else None
        where = f"the last complete checkpoint ({latest})" if latest is not None else "the last complete checkpoint"
        return f"Rerun with --resume to continue from {where}"

    def _check(self, ranks: Sequence[int], method: str) -> None:
        """Raise for the first rank of ``ranks`` already known dead."""
        for rank in ranks:
            if rank in self.dead:
                raise self._died(rank, method, "found dead earlier")

    def _probe_now(self, ranks: Sequence[int]) -> dict[int, str]:
        """Ranks among ``ranks`` that are dead now, with Ray's cause: each is asked ``ready``, and
        the ones that have not answered within :data:`PROBE_SECONDS` (all together) are
        unresponsive, not dead. Blocking (the driver's ``export_weights`` calls it; the event
        loop's callers use :meth:`_probe`)."""
        import ray

        probes = {self.workers[rank].ready.remote(): rank for rank in ranks}
        answered, _ = ray.wait(list(probes), num_returns=len(probes), timeout=PROBE_SECONDS)
        dead: dict[int, str] = {}
        for probe in answered:
            try:
                ray.get(probe)
            except ray.exceptions.RayActorError as exc:
                dead[probes[probe]] = self.death_cause(exc)
            except ray.exceptions.RayError:
                pass
        return dead

    async def _probe(self, ranks: Sequence[int]) -> dict[int, str]:
        """:meth:`_probe_now` without blocking the event loop."""
        return await asyncio.to_thread(self._probe_now, list(ranks))

    def _raise_death_behind(self, method: str, error: BaseException, dead: dict[int, str]) -> NoReturn:
        """Raise :meth:`_died` for the lowest rank of ``dead`` (the death behind ``error``, which a
        live rank's failure in a collective with it only echoes), or ``error`` itself when none died."""
        for rank, cause in sorted(dead.items()):
            raise self._died(rank, method, cause) from error
        raise error

    async def _on(self, ranks: Sequence[int], method: str, *args: Any) -> list[Any]:
        """``method(*args)`` on each of ``ranks`` at once; the results in that order.

        A worker found dead (now or before) raises :meth:`_died`: the first failure ends the
        wait (a live rank may be blocked in a collective with the dead one) and, when it is not
        itself a death, every rank is probed so the death, not its echo on a live rank, is what
        is reported. Failures with no death behind them are raised unchanged.
        """
        import ray

        ranks = list(ranks)
        self._check(ranks, method)
        shared = [ray.put(arg) for arg in args] if len(ranks) > 1 else list(args)
        tasks = [asyncio.ensure_future(self._await(getattr(self.workers[rank], method).remote(*shared)))
                 for rank in ranks]
        for task in tasks:
            task.add_done_callback(_retrieve)
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        failed = [(rank, task.exception()) for rank, task in zip(ranks, tasks, strict=True)
                  if task in done and task.exception() is not None]
        if not failed:
            return [task.result() for task in tasks]
        if method == "train_step":
            self.torn = f"a train step failed ({type(failed[0][1]).__name__})"
        for rank, exc in failed:
            if isinstance(exc, ray.exceptions.RayActorError):
                raise self._died(rank, method, self.death_cause(exc)) from exc
        self._raise_death_behind(method, failed[0][1], await self._probe(range(len(self.workers))))

    @staticmethod
    async def _await(ref: Any) -> Any:
        return await ref

    def _readers(self) -> list[int]:
        """The ranks a read goes to: all for a collective trainer, else rank 0."""
        return list(range(len(self.workers))) if self.collective else [0]

    # ------------------------------------------------------------------------ Trainer
    async def _read(self, method: str, *args: Any) -> Any:
        """Rank 0's answer to ``method``; asked of every rank when the trainer is collective."""
        return (await self._on(self._readers(), method, *args))[0]

    async def logprobs(self, samples: list[Sample], temperature: float) -> list[list[float]]:
        return await self._read("logprobs", samples, temperature)

    async def values(self, samples: list[Sample]) -> list[list[float]]:
        """The critic's values (trainers whose loss needs a critic), from rank 0."""
        return await self._read("values", samples)

    async def train_step(self, batch: RolloutBatch) -> dict[str, float]:
        return (await self._on(range(len(self.workers)), "train_step", batch))[0]

    def export_weights(self, bucket_bytes: int) -> Iterator[list[tuple[str, Any]]]:
        """Rank 0's buckets, fetched one at a time into this process (numpy arrays). Blocking:
        a sync that runs in the driver (``inprocess``) uses it; the Ray-native syncs move
        weights between the actors instead (``objectstore``, ``broadcast``)."""
        import ray

        self._check(self._readers(), "export_weights")
        try:
            for ref in self.rank0.export_buckets.remote(bucket_bytes):
                yield ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            raise self._died(0, "export_weights", self.death_cause(exc)) from exc
        except ray.exceptions.RayError as exc:  # rank 0 failed in a gather with a rank that died?
            self._raise_death_behind("export_weights", exc, self._probe_now(range(len(self.workers))))

    async def save(self, path: str) -> None:
        """Save from rank 0 (every rank when collective); refused, before anything is written,
        when a rank it needs is dead or rank 0's state is that of an unfinished step."""
        self._check(self._readers(), "save")
        if self.dead and self.torn is not None:
            raise ProviderError(f"not saving a checkpoint to {path}: {self.torn} when "
                                f"{'; '.join(self.dead.values())}, so the trainer's state is that of an unfinished "
                                f"step. {self._resume_hint()}", provider=self.provider, plugin=self.plugin)
        await self._read("save", path)

    async def load(self, path: str) -> None:
        await self._on(range(len(self.workers)), "load", path)

    async def offload(self) -> None:
        await self._on(range(len(self.workers)), "offload")

    async def onload(self) -> None:
        await self._on(range(len(self.workers)), "onload")

    async def plasmid_call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(trainer, *args)`` on rank 0 (see :func:`plasmid.remote.run_on`)."""
        return (await self._on([0], "call", fn, args))[0]

    async def plasmid_call_all(self, fn: Callable[..., Any], *args: Any) -> list[Any]:
        """``fn(trainer, *args)`` on every rank at once; the results in rank order."""
        return await self._on(range(len(self.workers)), "call", fn, args)

    async def shutdown(self) -> None:
        """Let the live workers leave their process group (at most :data:`SHUTDOWN_SECONDS`: a
        rank may be stuck in a collective with a dead one), then kill every worker."""
        import ray

        live = [worker for rank, worker in enumerate(self.workers) if rank not in self.dead]
        try:
            await asyncio.wait_for(asyncio.gather(*(worker.shutdown.remote() for worker in live)), SHUTDOWN_SECONDS)
        except (TimeoutError, ray.exceptions.RayError):
            pass
        for worker in self.workers:
            ray.kill(worker, no_restart=True)


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark a finished call's exception as seen (calls abandoned after another rank failed)."""
    if not task.cancelled():
        task.exception()


async def start_trainers(config: Config, placement: Placement, *, provider: Any = None) -> TrainerProxy:
    """Create the trainer workers in their bundles, join them in one process group (the store
    rank 0 names, see :meth:`TrainerWorker.rendezvous`), build each rank's trainer; the proxy
    over them. ``provider`` (the registry's trainer provider) names the trainer in errors."""
    import uuid

    import ray

    world = len(placement.trainer_bundles)
    resources = placement.trainer
    workers = []
    for rank, bundle in enumerate(placement.trainer_bundles):
        options = {**resources.as_options(), **placement.scheduling(bundle), "max_concurrency": 64, "max_restarts": 0}
        workers.append(ray.remote(TrainerWorker).options(**options).remote(config, rank, world, resources.cpus))
    try:
        await asyncio.gather(*(wait_ready(worker, f"trainer worker {rank}") for rank, worker in enumerate(workers)))
        init_method = await workers[0].rendezvous.remote(uuid.uuid4().hex)
        infos = await asyncio.gather(*(worker.setup.remote(init_method) for worker in workers))
    except BaseException:
        for worker in workers:
            ray.kill(worker, no_restart=True)
        raise
    name = provider.name if provider is not None else config.option.trainer
    described = f"trainer '{name}'" + (f" from plugin {provider.plugin.label}" if provider is not None else "")
    proxy = TrainerProxy(workers, list(infos), trainer=described, provider=name,
                         plugin=provider.plugin.name if provider is not None else "",
                         run_dir=str(config.run_dir) if config.run_dir is not None else None)
    if proxy.collective and world > 1:
        await workers[0].lead.remote(workers[1:])
    if world > 1:
        kind = "collective" if proxy.collective else "rank-0 reads"
        pids = ", ".join(str(info.get("pid")) for info in infos)
        report(f"{world} trainer workers joined one process group at {init_method} ({kind}; pids {pids})")
    return proxy
