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
``save``, ``logprobs``, ``values`` and exports work (so the run may checkpoint).

When the workers lost the state of the last finished step (a rank that ``save`` needs is dead,
or a train step failed or was cut short by the death, leaving the state of an unfinished step),
``save`` writes the driver-held *step snapshot* of that step instead (:mod:`plasmid_ray.snapshots`,
``--ray-step-snapshot``): after each train step the reader ranks save into a temporary directory
and hand the files back as the return value of an actor task, which the driver owns and Ray's
object store keeps after the worker died. It starts once the step's weight sync has read the
weights whole (a ``plasmid_call``/``plasmid_call_all`` after which rank 0 has ended an export and
has none open, or the end of a driver-side export), so it runs while the engines roll out the next
step instead of delaying the sync, or, with no sync in between, right before the next train step.
It is awaited before any other call goes to the workers: one conversation at a time, since Ray
does not keep the order of an async actor's tasks and a collective save beside an export's
collectives would deadlock. One report line names
the step a checkpoint came from. Without a
whole snapshot of that step (snapshots off, or the death cut the snapshot short) ``save`` refuses,
naming why, and the death's line says the state was lost. A refused ``save`` writes nothing, so
the checkpoint being written stays ``.partial`` and the last complete one stands
(:mod:`plasmid.checkpoint`).
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from plasmid.checkpoint import Checkpoints
from plasmid.config import Config
from plasmid.errors import ProviderError
from plasmid.types import RolloutBatch, Sample
from plasmid_ray import snapshots
from plasmid_ray.actors import TrainerWorker
from plasmid_ray.deaths import classify, oom_kills, oom_kills_since
from plasmid_ray.engines import report, wait_ready
from plasmid_ray.options import RayOptions
from plasmid_ray.placement import Placement
from plasmid_ray.snapshots import AUTO_MAX_BYTES, SETTLE_SECONDS, snapshot_dir, write_tree

#: Seconds a live worker has to answer the liveness probe after another call failed.
PROBE_SECONDS = 10.0
#: Seconds the workers get to leave their process group at shutdown before they are killed.
SHUTDOWN_SECONDS = 10.0


@dataclass
class Snapshot:
    """A step snapshot being taken or held (:mod:`plasmid_ray.snapshots`): of the state after
    train step ``step``; ``files`` the ref of rank 0's ``{relative path: bytes}``, ``sizes`` the
    refs of each reader rank's ``(bytes, seconds the save took)`` (all ready and fine: the snapshot
    is whole), ``token`` its directory's name."""

    step: int
    files: Any
    sizes: list[Any]
    token: str


class TrainerProxy:
    """:class:`plasmid.protocols.Trainer` over ``--trainer-workers`` :class:`TrainerWorker` actors.

    :ivar dead: rank -> the error line of each worker found dead (see the module docstring).
    """

    #: after a failed train step, ``save`` writes the last finished step's snapshot or refuses
    #: (:meth:`plasmid.protocols.Trainer.train_step`), so the loop checkpoints that step then
    saves_finished_step = True

    def __init__(self, workers: list[Any], infos: list[dict[str, Any]], *, trainer: str = "trainer",
                 provider: str = "", plugin: str = "", run_dir: str | None = None, step_snapshot: str = "off") -> None:
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
        #: ``--ray-step-snapshot`` (``auto`` turns into ``off`` when a snapshot is too large)
        self.step_snapshot = step_snapshot
        nodes = {info.get("node_ip") for info in infos}
        if step_snapshot != "off" and self.collective and len(nodes) > 1:
            report(f"--ray-step-snapshot {step_snapshot}: off, the ranks of the collective {trainer} are on "
                   f"{len(nodes)} nodes (a snapshot needs them on one)")
            self.step_snapshot = "off"
        #: the last train step that finished (None: none since the start or a load)
        self.finished: int | None = None
        #: the finished step whose snapshot is yet to start (see the module docstring)
        self.due: int | None = None
        #: the whole snapshot held, and the one being taken (:class:`Snapshot`)
        self.snapshot: Snapshot | None = None
        self.pending: Snapshot | None = None
        #: seconds each snapshot took (rank 0's save) and seconds between train steps, until
        #: ``auto`` has judged the cost (:meth:`_judge_cost`; None after)
        self.durations: list[float] | None = []
        self.steps: list[float] | None = []
        self.last_step: float | None = None

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
        lost = rank in self._readers() or self.torn is not None
        return ProviderError(f"{self.dead[rank]}; the run cannot go on without it. {self._resume_hint(lost)}",
                             provider=self.provider, plugin=self.plugin)

    def _resume_hint(self, lost: bool = False) -> str:
        """Where ``--resume`` continues from; ``lost``: the workers lost the last finished step's
        state, so that is the driver-held snapshot's checkpoint, or the last complete one (and why)."""
        root = Checkpoints(self.run_dir).root if self.run_dir is not None else None
        if lost and self._snapshot_now() is not None and root is not None:
            step = self.finished
            return (f"Rerun with --resume to continue from step {step}'s checkpoint ({root / f'step_{step:06d}'}), "
                    f"written from the driver-held snapshot of its trainer state")
        latest = Checkpoints(self.run_dir).latest() if self.run_dir is not None else None
        where = f"the last complete checkpoint ({latest})" if latest is not None else "the last complete checkpoint"
        why = ""
        if lost and self.finished is not None:
            why = (" (--ray-step-snapshot off)" if self.step_snapshot == "off"
                   else " (no whole snapshot of it was held)")
            why = f"; the trainer state of the last finished step ({self.finished}) was lost with it{why}"
        return f"Rerun with --resume to continue from {where}{why}"

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
        await self._settle()  # one conversation with the workers at a time (see _start_snapshot)
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
        """The step on every rank, once the previous step's snapshot is whole (started now when no
        sync started it); this step's snapshot is then due (:meth:`_start_snapshot`)."""
        began = time.perf_counter()
        self._start_snapshot()
        await self._settle()
        self._judge_cost(began)
        metrics = (await self._on(range(len(self.workers)), "train_step", batch))[0]
        self.finished = batch.rollout_id
        self.due = batch.rollout_id if self.step_snapshot != "off" else None
        return metrics

    def _start_snapshot(self) -> None:
        """Start the due snapshot on the reader ranks (non-blocking: the driver keeps the refs).

        Called only when no export is open on the workers: a snapshot of a collective trainer is
        a collective save, and Ray does not run an async actor's tasks in the order they were
        sent, so a save sent beside an export's calls could meet the export's collectives on
        another rank (a deadlock). For the same reason every call to the workers first waits for
        the snapshot being taken (:meth:`_on`)."""
        if self.due is None or self.step_snapshot == "off" or any(rank in self.dead for rank in self._readers()):
            return
        base, token = self.infos[0]["snapshot_base"], uuid.uuid4().hex
        parts = [self.workers[rank].snapshot.options(num_returns=2).remote(base, token, rank == 0)
                 for rank in self._readers()]
        self.pending, self.due = Snapshot(self.due, parts[0][0], [size for _, size in parts], token), None

    # ------------------------------------------------------------------------ step snapshots
    async def _settle(self, timeout: float | None = None) -> None:
        """Wait (at most ``timeout`` s) for the snapshot being taken, then :meth:`_conclude` it;
        the first failed part ends the wait (a live rank may be stuck in a collective save with a
        dead one)."""
        if self.pending is None:
            return
        parts = [asyncio.ensure_future(self._await(size)) for size in self.pending.sizes]
        for part in parts:
            part.add_done_callback(_retrieve)
        await asyncio.wait(parts, timeout=timeout, return_when=asyncio.FIRST_EXCEPTION)
        self._conclude()

    def _judge_cost(self, now: float) -> None:
        """With ``auto``, once :data:`AUTO_SAMPLES` steps after :data:`AUTO_WARMUP` have been timed
        (a step starting at ``now``): turn snapshots off, with one report line, when their median
        duration is over :data:`AUTO_MAX_SHARE` of the median step. (The duration, not the part
        the rollout does not hide: on a machine whose cores the engines keep busy, a snapshot's
        work slows the rollout it overlaps.)"""
        if self.step_snapshot != "auto" or self.steps is None or self.durations is None:
            return
        if self.last_step is not None:
            self.steps.append(now - self.last_step)
        self.last_step = now
        if len(self.steps) < snapshots.AUTO_WARMUP + snapshots.AUTO_SAMPLES:
            return
        took = statistics.median(self.durations[snapshots.AUTO_WARMUP:] or [0.0])
        step = statistics.median(self.steps[snapshots.AUTO_WARMUP:])
        self.steps = self.durations = None  # judged once
        if took > snapshots.AUTO_MAX_SHARE * step:
            report(f"--ray-step-snapshot auto: off, a snapshot takes {1000 * took:.0f} ms of a "
                   f"{1000 * step:.0f} ms step (over {snapshots.AUTO_MAX_SHARE:.0%}); --ray-step-snapshot on keeps it")
            self.step_snapshot, self.snapshot, self.due = "off", None, None

    def _settle_now(self) -> None:
        """:meth:`_settle`, blocking (for the driver-side export, which is not a coroutine)."""
        import ray

        if self.pending is not None:
            ray.wait(self.pending.sizes, num_returns=len(self.pending.sizes), fetch_local=False)
            self._conclude()

    def _conclude(self) -> None:
        """Settle the snapshot being taken, without waiting: a failed part drops it (a worker that
        raised, rather than died, turns snapshots off with a report line); all parts done make it the
        snapshot held (the older one dropped), unless ``auto`` finds it over :data:`AUTO_MAX_BYTES`.
        Parts still running keep it pending."""
        import ray

        pending = self.pending
        if pending is None:
            return
        done, running = ray.wait(pending.sizes, num_returns=len(pending.sizes), timeout=0)
        errors = []
        for part in done:
            try:
                ray.get(part)
            except ray.exceptions.RayError as exc:
                errors.append(exc)
        if errors:
            self.pending = self.snapshot = None
            self._remove(pending)
            if not running and not any(isinstance(exc, ray.exceptions.RayActorError) for exc in errors):
                report(f"the step snapshot of step {pending.step} failed ({classify(errors[0]).cause}); "
                       f"--ray-step-snapshot {self.step_snapshot} is now off")
                self.step_snapshot = "off"
            return
        if running:
            return
        self.pending, (size, seconds) = None, ray.get(pending.sizes[0])
        if self.step_snapshot == "auto" and self.durations is not None:  # until judged (_judge_cost)
            self.durations.append(seconds)
        if self.step_snapshot == "auto" and size > AUTO_MAX_BYTES:
            report(f"--ray-step-snapshot auto: off, the snapshot of step {pending.step} is {size / 1024**3:.1f} GiB "
                   f"(over {AUTO_MAX_BYTES / 1024**3:.0f} GiB); --ray-step-snapshot on keeps it")
            self.step_snapshot, self.snapshot = "off", None
            return
        self.snapshot = pending

    def _snapshot_now(self) -> Snapshot | None:
        """The snapshot held of the last finished step, as far as is known without waiting."""
        self._conclude()
        held = self.snapshot
        return held if self.pending is None and held is not None and held.step == self.finished else None

    def _remove(self, snapshot: Snapshot) -> None:
        """Delete what a failed snapshot left in its directory, when that is on this machine
        (a worker killed mid-snapshot cannot)."""
        base = self.infos[0].get("snapshot_base") if self.infos else None
        if base is not None:
            shutil.rmtree(snapshot_dir(base, snapshot.token), ignore_errors=True)

    async def _save_snapshot(self, path: str) -> bool:
        """Write the snapshot of the last finished step into ``path``, if one is held (the one in
        progress is awaited up to :data:`SETTLE_SECONDS`); whether it was."""
        await self._settle(SETTLE_SECONDS)
        held = self._snapshot_now()
        if held is None:
            return False
        files = await held.files
        written = await asyncio.to_thread(write_tree, files, path)
        report(f"the trainer workers lost the state of step {held.step}: {path} is written from the driver-held "
               f"snapshot of step {held.step} ({len(files)} files, {written} bytes)")
        return True

    def export_weights(self, bucket_bytes: int) -> Iterator[list[tuple[str, Any]]]:
        """Rank 0's buckets, fetched one at a time into this process (numpy arrays). Blocking:
        a sync that runs in the driver (``inprocess``) uses it; the Ray-native syncs move
        weights between the actors instead (``objectstore``, ``broadcast``)."""
        import ray

        self._check(self._readers(), "export_weights")
        self._settle_now()
        try:
            for ref in self.rank0.export_buckets.remote(bucket_bytes):
                yield ray.get(ref)
            self._start_snapshot()  # the sync has read the weights
        except ray.exceptions.RayActorError as exc:
            raise self._died(0, "export_weights", self.death_cause(exc)) from exc
        except ray.exceptions.RayError as exc:  # rank 0 failed in a gather with a rank that died?
            self._raise_death_behind("export_weights", exc, self._probe_now(range(len(self.workers))))

    async def save(self, path: str) -> None:
        """Save from rank 0 (every rank when collective). When a rank it needs is dead or rank 0's
        state is that of an unfinished step (found before or during the save), the driver-held
        snapshot of the last finished step is written instead (:mod:`plasmid_ray.snapshots`);
        without one the save is refused (before anything is written, when found before)."""
        readers = self._readers()
        lost = any(rank in self.dead for rank in readers) or self.torn is not None
        if lost and await self._save_snapshot(path):
            return
        self._check(readers, "save")
        if self.torn is not None:
            died = f" when {'; '.join(self.dead.values())}" if self.dead else ""
            raise ProviderError(f"not saving a checkpoint to {path}: {self.torn}{died}, so the trainer's state is "
                                f"that of an unfinished step. {self._resume_hint(lost=True)}",
                                provider=self.provider, plugin=self.plugin)
        try:
            await self._read("save", path)
        except ProviderError:  # a reader died during the save: what it wrote is replaced by the snapshot
            if not any(rank in self.dead for rank in readers):
                raise
            await asyncio.to_thread(shutil.rmtree, path, True)
            if not await self._save_snapshot(path):
                raise

    async def load(self, path: str) -> None:
        """Load ``path`` on every rank; the snapshots held are of other state and dropped."""
        await self._settle()
        self.finished = self.snapshot = self.due = None
        await self._on(range(len(self.workers)), "load", path)

    async def offload(self) -> None:
        await self._on(range(len(self.workers)), "offload")

    async def onload(self) -> None:
        await self._on(range(len(self.workers)), "onload")

    async def plasmid_call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(trainer, *args)`` on rank 0 (see :func:`plasmid.remote.run_on`); then the due
        snapshot starts if the weights have been read whole since the step (an export ended and
        none is open: a weight sync's trainer-side steps are done)."""
        result, read = (await self._on([0], "call", fn, args))[0]
        if read:
            self._start_snapshot()
        return result

    async def plasmid_call_all(self, fn: Callable[..., Any], *args: Any) -> list[Any]:
        """``fn(trainer, *args)`` on every rank at once; the results in rank order; then the due
        snapshot may start, as after :meth:`plasmid_call` (rank 0 tells)."""
        answers = await self._on(range(len(self.workers)), "call", fn, args)
        if answers[0][1]:
            self._start_snapshot()
        return [result for result, _read in answers]

    async def shutdown(self) -> None:
        """Let the live workers leave their process group (at most :data:`SHUTDOWN_SECONDS`: a
        rank may be stuck in a collective with a dead one), then kill every worker."""
        import ray

        if self.pending is not None:
            self._remove(self.pending)
        self.snapshot = self.pending = None
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
                         run_dir=str(config.run_dir) if config.run_dir is not None else None,
                         step_snapshot=RayOptions.of(config).ray_step_snapshot)
    if proxy.collective and world > 1:
        await workers[0].lead.remote(workers[1:])
    if world > 1:
        kind = "collective" if proxy.collective else "rank-0 reads"
        pids = ", ".join(str(info.get("pid")) for info in infos)
        report(f"{world} trainer workers joined one process group at {init_method} ({kind}; pids {pids})")
    return proxy
