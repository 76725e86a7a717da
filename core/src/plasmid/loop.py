"""The three-beat RL loop: rollout -> train -> weight sync, with evaluation and checkpoints.

Everything it calls is a provider chosen by plugins; this file only orders the beats. With
``--schedule async`` the rollout of step k+1 runs while step k trains; weights are synced every
``--update-weights-interval`` steps, once the rollout in flight has finished.

Every step reports ``time/rollout_seconds`` (waiting for the step's rollout), ``time/train_seconds``
and, when it syncs, ``time/sync_seconds``; ``--profile`` adds the breakdown of each step's wall time
that :class:`plasmid.profiling.StepClock` measures (README: "Where a step's time goes").

The shape: :func:`train` is start (:meth:`Loop.start`: options, ``--resume``), then for each
step its rollout (:meth:`Loop.next_batch`) and :meth:`Loop.step` (train, sync, evaluate, then
:meth:`Loop.end_step`: observers, the :class:`~plasmid.steplog.StepLog`, checkpoint, stop or go
on), then finish (:meth:`Loop.finish`). Syncs, evaluations and checkpoints share one cadence,
:func:`every`. The loop imports nothing of the application: the per-step log is handed in, and
stalls (:mod:`plasmid.stalls`), profiling (:mod:`plasmid.profiling`) and the garbage collector's
treatment (:mod:`plasmid.loop_gc`) are kernel modules of their own.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plasmid.checkpoint import Checkpoints
from plasmid.config import Config
from plasmid.errors import DataExhausted, PlasmidError, PluginError, RunStopped
from plasmid.kernel_options import (
    CheckpointOptions,
    EvalOptions,
    GeneralOptions,
    ProfileOptions,
    RolloutOptions,
    ScheduleOptions,
)
from plasmid.loop_gc import startup_objects_frozen
from plasmid.profiling import StepClock
from plasmid.protocols import SupportsSyncStart
from plasmid.session import Session
from plasmid.shutdown import StopSignals
from plasmid.stalls import Stalls
from plasmid.steplog import StepLog
from plasmid.types import Group, RolloutBatch, SyncReport

__all__ = ["Loop", "StepClock", "Stalls", "StepLog", "drop_stale", "every", "provider_label", "train"]


async def train(session: Session, log: StepLog) -> dict[str, float]:
    """Run ``--num-rollouts`` steps (or until ``--stop-at-eval-acc``); returns the last metrics.

    Each step's entry goes to ``log`` (a :class:`~plasmid.steplog.StepLog`; ``plasmid train``
    passes the run directory's). Stops early, always after writing a checkpoint of the last
    finished step: on SIGTERM or SIGINT (returns normally, see :mod:`plasmid.shutdown`), when the
    data is used up (returns), and with :class:`~plasmid.errors.RunStopped` when the run cannot
    learn (see :class:`~plasmid.stalls.Stalls`).
    """
    run = await Loop.start(session, log)
    metrics: dict[str, float] = {}
    with StopSignals(asyncio.get_running_loop()) as stop, startup_objects_frozen():
        run.stop = stop
        try:
            for rollout_id in range(run.first, run.steps):
                began = time.perf_counter()
                batch = await run.next_batch(rollout_id)
                if batch is None:  # the data is used up
                    break
                metrics, go_on = await run.step(rollout_id, batch, began)
                if not go_on:
                    break
        finally:
            run.finish()
    return metrics


def every(n: int, rollout_id: int, last: bool) -> bool:
    """Whether step ``rollout_id`` (0-based) is one of every ``n``-th (``n`` <= 0: none) or the
    ``last`` step: the cadence of weight syncs, evaluations and checkpoints."""
    return last or (n > 0 and (rollout_id + 1) % n == 0)


@dataclass
class Loop:
    """One run of the loop: what :func:`train` made at the start, and the state between steps.

    :ivar first: the first step to run (after the checkpoint a ``--resume`` restored).
    :ivar version: the weight version the engines serve.
    :ivar saved: the step of the newest checkpoint (-1: none).
    :ivar data_state: the data source's state as of the last finished rollout (what
        :meth:`save` checkpoints; see :meth:`plasmid.checkpoint.Checkpoints.save`).
    """

    session: Session
    log: StepLog
    checkpoints: Checkpoints
    stalls: Stalls
    clock: StepClock | None
    eval_groups: list[Group]
    steps: int
    first: int = 0
    version: int = 0
    saved: int = -1
    data_state: dict[str, Any] = field(default_factory=dict)
    first_metrics: dict[str, float] = field(default_factory=dict)
    in_flight: asyncio.Future[RolloutBatch] | None = None
    stop: StopSignals | None = None

    @property
    def config(self) -> Config:
        return self.session.config

    @classmethod
    async def start(cls, session: Session, log: StepLog) -> Loop:
        """Read the options, restore the newest checkpoint on ``--resume``, start the weight sync
        (:class:`~plasmid.protocols.SupportsSyncStart`), sync a restored checkpoint's weights, and tell
        ``log`` where the run starts."""
        config, ctx = session.config, session.ctx
        saving, evaluation = CheckpointOptions.of(config), EvalOptions.of(config)
        trainer_label = provider_label(session, "trainer", config.option.trainer)
        run = cls(session, log, Checkpoints(config.run_dir, keep=saving.keep_checkpoints, trainer_label=trainer_label),
                  Stalls(config, trainer_label),
                  StepClock(getattr(ctx, "rewards", None)) if ProfileOptions.of(config).profile else None,
                  ctx.data_source.eval_groups() if evaluation.eval_interval else [],
                  RolloutOptions.of(config).num_rollouts)
        latest = run.checkpoints.latest() if GeneralOptions.of(config).resume else None
        if latest is not None:
            meta = await run.checkpoints.restore(latest, session.trainer, ctx.data_source)
            run.first, run.version, run.saved = meta["rollout_id"] + 1, meta["weight_version"], meta["rollout_id"]
            if "in_flight" in meta:  # trained as it was, not generated again with the checkpoint's newer weights
                run.in_flight = asyncio.get_running_loop().create_future()
                run.in_flight.set_result(meta["in_flight"])
        if isinstance(session.weight_sync, SupportsSyncStart):
            await session.weight_sync.start(session.trainer, session.engines)
        if latest is not None:
            await session.weight_sync.sync(session.trainer, session.engines, run.version)
        log.resume_from(run.first)
        run.data_state = ctx.data_source.state_dict()
        run.first_metrics = dict(session.startup.metrics)  # start-up's (data/dropped_overlong), with the first step
        return run

    def rollout(self, rollout_id: int) -> asyncio.Task[RolloutBatch]:
        return asyncio.ensure_future(self.session.driver.run(self.session.ctx, rollout_id))

    async def next_batch(self, rollout_id: int) -> RolloutBatch | None:
        """Step ``rollout_id``'s rollout (the one in flight, or one started now), with the next
        step's started when ``--schedule async`` overlaps them; ``None`` when the data is used up
        (the last finished step checkpointed). A failed rollout checkpoints the last finished step
        (:meth:`keep_progress`) and is re-raised."""
        try:
            batch = await (self.in_flight or self.rollout(rollout_id))
        except DataExhausted as exc:
            print(f"plasmid: the data is used up ({exc}); ending the run", file=sys.stderr)
            self.data_state = self.session.data_source.state_dict()  # the failed get_groups consumed nothing
            if rollout_id > self.first and self.saved != rollout_id - 1:
                await self.save(rollout_id - 1)
            return None
        except Exception:
            await self.keep_progress(rollout_id - 1)  # a rollout-side provider failed; re-raised
            raise
        self.data_state = self.session.data_source.state_dict()  # before the next rollout takes its prompts
        overlap = ScheduleOptions.of(self.config).schedule == "async"
        last, stopping = rollout_id + 1 == self.steps, self.stop is not None and self.stop.requested
        self.in_flight = self.rollout(rollout_id + 1) if overlap and not last and not stopping else None
        return batch

    async def step(self, rollout_id: int, batch: RolloutBatch, began: float) -> tuple[dict[str, float], bool]:
        """Train on ``batch``, sync, evaluate, log and checkpoint step ``rollout_id`` (whose rollout
        began at ``began``); its metrics, and whether the run goes on."""
        rolled, last = time.perf_counter(), rollout_id + 1 == self.steps
        schedule = ScheduleOptions.of(self.config)
        metrics = {**self.first_metrics, **batch.metrics, **drop_stale(batch, self.version, schedule.max_staleness)}
        self.first_metrics = {}
        try:
            metrics.update(await self.train_step(batch))
        except Exception:
            if getattr(self.session.trainer, "saves_finished_step", False):  # see Trainer.train_step
                await self.keep_progress(rollout_id - 1, batch)  # a --resume trains this very batch
            raise
        trained = time.perf_counter()
        await self.colocated("resume_memory")
        sync_began = time.perf_counter()
        if every(schedule.update_weights_interval, rollout_id, last):
            metrics.update(await self.sync(rollout_id))
        metrics.update({"time/rollout_seconds": rolled - began, "time/train_seconds": trained - rolled,
                        "weight_version": float(self.version)})
        sync_wall, evaluated = time.perf_counter() - sync_began, time.perf_counter()
        if self.eval_groups and every(EvalOptions.of(self.config).eval_interval, rollout_id, last):
            ctx = self.session.ctx
            metrics.update(await self.session.driver.evaluate(ctx, self.eval_groups, ctx.eval_sampling()))
        if self.clock is not None:
            metrics.update(self.clock.step(metrics, sync_seconds=sync_wall,
                                           eval_seconds=time.perf_counter() - evaluated))
        return metrics, await self.end_step(rollout_id, metrics, trained=bool(batch.groups), last=last)

    async def train_step(self, batch: RolloutBatch) -> dict[str, float]:
        """The trainer's step on ``batch`` (a colocated engine's memory released first); a batch
        whose groups were all dropped is a skipped step."""
        await self.colocated("release_memory")
        return await self.session.trainer.train_step(batch) if batch.groups else {"train/skipped_steps": 1.0}

    async def colocated(self, method: str) -> None:
        """Call ``method`` (``release_memory``, ``resume_memory``) of every engine, all at once,
        with ``--placement colocate``."""
        if ScheduleOptions.of(self.config).placement == "colocate":
            await asyncio.gather(*(getattr(engine, method)() for engine in self.session.engines))

    async def sync(self, rollout_id: int) -> dict[str, float]:
        """Sync the weights of step ``rollout_id`` into the engines, once the rollout in flight
        has finished (weights never change under it); the sync's metrics. A failed sync (one past
        its deadline, one that delivered other weights) checkpoints the trained step, then is raised."""
        if self.in_flight is not None:
            await asyncio.wait([self.in_flight])
        self.version = rollout_id + 1
        session = self.session
        try:
            report: SyncReport = await session.weight_sync.sync(session.trainer, session.engines, self.version)
        except Exception:
            await self.keep_progress(rollout_id)  # a --resume syncs the checkpoint's weights first
            raise
        session.startup.manager.weights_synced(rollout_id, report)
        return {"time/sync_seconds": report.seconds, "sync/bytes": float(report.bytes), **report.metrics}

    async def end_step(self, rollout_id: int, metrics: dict[str, float], *, trained: bool, last: bool) -> bool:
        """Hand the step's metrics to the observers and the log, checkpoint when due (or before
        stopping), and tell whether the run goes on; raises :class:`RunStopped` when it stalled,
        and a :class:`PluginError` when an observer failed with ``--observer-errors fail`` (this
        step's or its sync's; the step is logged and checkpointed first)."""
        manager, config = self.session.startup.manager, self.config
        target = EvalOptions.of(config).stop_at_eval_acc
        done = target is not None and metrics.get("eval/accuracy", -1.0) >= target
        manager.metrics(rollout_id, metrics)
        entry = self.log.write(rollout_id, metrics)
        stalled = self.stalls.observe(rollout_id, metrics, trained=trained)
        stopping = self.stop.requested if self.stop is not None else None
        due = every(CheckpointOptions.of(config).save_interval, rollout_id, last)
        if done or stalled or stopping or manager.observer_failure or due:
            save = self.save(rollout_id)
            path = await save if self.clock is None else await self.clock.saving(save)
        manager.step_end(rollout_id, str(config.run_dir), entry)
        if stalled or manager.observer_failure:
            path = path if self.saved == rollout_id else await self.save(rollout_id)
            error = RunStopped if stalled else PluginError
            raise error(f"{stalled or manager.observer_failure}; checkpoint {path} written (continue with --resume)")
        if stopping and not last:
            print(f"plasmid: stopped by {stopping} after step {rollout_id}; checkpoint {path} "
                  f"written; continue with --resume", file=sys.stderr)
        return not (stopping or done)

    async def save(self, rollout_id: int, batch: RolloutBatch | None = None) -> Path:
        """Checkpoint step ``rollout_id``, the log's entries made durable first, with ``batch`` (the
        next step's, whose train step failed) or else a rollout in flight (``--schedule async``, awaited)
        as ``in_flight``, and the data source's state after it: a resume trains on those samples."""
        self.log.make_durable()  # the metrics of the steps a checkpoint holds are on disk before it is
        data_state, in_flight = self.data_state, batch
        if self.in_flight is not None and batch is None:
            await asyncio.wait([self.in_flight])
            if not self.in_flight.cancelled() and self.in_flight.exception() is None:
                data_state, in_flight = self.session.data_source.state_dict(), self.in_flight.result()
        path = await self.checkpoints.save(rollout_id, self.session.trainer, data_state,
                                           {"weight_version": self.version, "plugin_lock": self.config.plugin_lock},
                                           in_flight)
        self.saved = rollout_id
        return path

    async def keep_progress(self, rollout_id: int, batch: RolloutBatch | None = None) -> None:
        """Checkpoint step ``rollout_id`` on the way out of a failure in the next step's rollout or
        sync, unless it is saved already, or in its train step (``batch``, saved to be trained on
        resume; a trainer that lost its state saves the last finished step's or refuses); a failure
        to save is reported and the original error goes on."""
        if rollout_id < self.first or (self.saved == rollout_id and batch is None):
            return
        try:
            path = await self.save(rollout_id, batch)
        except Exception as exc:  # noqa: BLE001 - the error that stopped the run matters more
            print(f"plasmid: could not checkpoint step {rollout_id} after the failure below: {exc}", file=sys.stderr)
        else:
            print(f"plasmid: checkpoint {path} of step {rollout_id} written before stopping on the error below; "
                  f"continue with --resume once it is fixed", file=sys.stderr)

    def finish(self) -> None:
        """Cancel the rollout still in flight (a run that stopped early, or failed)."""
        if self.in_flight is not None:
            self.in_flight.cancel()


def provider_label(session: Session, family: str, name: str | None) -> str:
    """``trainer 'x' from plugin 'y' (distribution ...)``, for messages; just the family and
    name when the registry does not know it (a runtime that builds providers elsewhere)."""
    try:
        provider = session.startup.registry.get(family, name or "")
    except PlasmidError:
        return f"{family} {name!r}"
    return f"{family} {provider.name!r} from plugin {provider.plugin.label}"


def drop_stale(batch: RolloutBatch, version: int, max_staleness: int | None) -> dict[str, float]:
    """Measure how many weight versions behind ``version`` the samples were generated, and drop
    the groups beyond ``max_staleness`` (in place); returns the staleness metrics."""
    ages = [version - s.weight_version for s in batch.samples if s.weight_version is not None]
    metrics = {}
    if ages:
        metrics = {"rollout/staleness_mean": sum(ages) / len(ages), "rollout/staleness_max": float(max(ages))}
    if max_staleness is not None:
        fresh = [g for g in batch.groups
                 if all(s.weight_version is None or version - s.weight_version <= max_staleness for s in g.samples)]
        metrics["rollout/stale_groups_dropped"] = float(len(batch.groups) - len(fresh))
        batch.groups = fresh
    return metrics
