"""The three-beat RL loop: rollout -> train -> weight sync, with evaluation and checkpoints.

Everything it calls is a provider chosen by plugins; this file only orders the beats. With
``--schedule async`` the rollout of step k+1 runs while step k trains; weights are synced every
``--update-weights-interval`` steps, once the rollout in flight has finished.

Every step reports ``time/rollout_seconds`` (waiting for the step's rollout), ``time/train_seconds``
(the train step, with a colocated engine's memory release) and, when it syncs, ``time/sync_seconds``.
With ``--profile`` it adds (:class:`StepClock`) ``time/step_seconds``, the wall time from the point
the previous step's metrics were taken to this step's, which is the sum of ``time/rollout_seconds``,
``time/train_seconds``, ``time/sync_wall_seconds`` (the loop's wall time of the weight sync, with
the wait for a rollout in flight; ``time/sync_seconds`` is the sync's own figure),
``time/eval_seconds``, ``time/checkpoint_seconds``
(the previous step's checkpoint, written after its metrics) and ``time/overhead_seconds``: the rest,
the loop's own work (batch bookkeeping, metrics and observer hooks, the metrics log, engine memory
resume). ``time/reward_seconds`` is the wall time within the rollout in which at least one group
was being scored (it overlaps generation). The trainer adds its own (torchtrain:
``train/forward_backward_seconds``, ``train/optimizer_seconds``).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import TextIO

from plasmid.checkpoint import Checkpoints
from plasmid.collector import startup_objects_frozen
from plasmid.config import Config
from plasmid.errors import DataExhausted, PlasmidError, RunStopped
from plasmid.kernel_options import (
    CheckpointOptions,
    EvalOptions,
    FaultOptions,
    GeneralOptions,
    ProfileOptions,
    RolloutOptions,
    ScheduleOptions,
)
from plasmid.protocols import BAD_STEP_PREFIX
from plasmid.runlog import RunLog
from plasmid.session import Session
from plasmid.shutdown import StopSignals
from plasmid.types import RolloutBatch


async def train(session: Session, log: RunLog) -> dict[str, float]:
    """Run ``--num-rollouts`` steps (or until ``--stop-at-eval-acc``); returns the last metrics.

    Stops early, always after writing a checkpoint of the last finished step: on SIGTERM or
    SIGINT (returns normally, see :mod:`plasmid.shutdown`), when the data is used up (returns),
    and with :class:`~plasmid.errors.RunStopped` when the run cannot learn (see :class:`Stalls`).
    """
    config, ctx, trainer, manager = session.config, session.ctx, session.trainer, session.startup.manager
    steps, schedule = RolloutOptions.of(config).num_rollouts, ScheduleOptions.of(config)
    evaluation, saving = EvalOptions.of(config), CheckpointOptions.of(config)
    trainer_label = provider_label(session, "trainer", config.option.trainer)
    checkpoints = Checkpoints(config.run_dir, keep=saving.keep_checkpoints, trainer_label=trainer_label)
    stalls = Stalls(config, trainer_label)
    eval_groups = ctx.data_source.eval_groups() if evaluation.eval_interval else []
    colocated, overlap = schedule.placement == "colocate", schedule.schedule == "async"
    clock = StepClock(getattr(ctx, "rewards", None)) if ProfileOptions.of(config).profile else None

    start, version, saved = 0, 0, -1
    if GeneralOptions.of(config).resume and (latest := checkpoints.latest()) is not None:
        meta = await checkpoints.restore(latest, trainer, ctx.data_source)
        start, version = meta["rollout_id"] + 1, meta["weight_version"]
        saved = meta["rollout_id"]
        await session.weight_sync.sync(trainer, session.engines, version)
    log.resume_from(start)

    def rollout(rollout_id: int) -> asyncio.Task[RolloutBatch]:
        return asyncio.ensure_future(session.driver.run(ctx, rollout_id))

    data_state = ctx.data_source.state_dict()  # as of the last finished rollout (see Checkpoints.save)

    async def save(rollout_id: int) -> Path:
        nonlocal saved
        log.make_durable()  # the metrics of the steps a checkpoint holds are on disk before it is
        path = await checkpoints.save(rollout_id, trainer, data_state,
                                      {"weight_version": version, "plugin_lock": config.plugin_lock})
        saved = rollout_id
        return path

    async def keep_progress(rollout_id: int) -> None:
        """Checkpoint step ``rollout_id`` on the way out of a failure in the next step's rollout
        (the trainer has not been touched since that step, and ``data_state`` is its own), unless
        it is saved already; a failure to save is reported and the original error goes on."""
        if rollout_id < start or saved == rollout_id:
            return
        try:
            path = await save(rollout_id)
        except Exception as exc:  # noqa: BLE001 - the error that stopped the run matters more
            print(f"plasmid: could not checkpoint step {rollout_id} after the failure below: {exc}", file=sys.stderr)
        else:
            print(f"plasmid: checkpoint {path} of step {rollout_id} written before stopping on the error below; "
                  f"continue with --resume once it is fixed", file=sys.stderr)

    metrics: dict[str, float] = {}
    first_metrics = dict(session.startup.metrics)  # start-up's (data/dropped_overlong), with the first step
    in_flight: asyncio.Task[RolloutBatch] | None = None
    with StopSignals(asyncio.get_running_loop()) as stop, startup_objects_frozen():
        try:
            for rollout_id in range(start, steps):
                began = time.perf_counter()
                try:
                    batch = await (in_flight or rollout(rollout_id))
                except DataExhausted as exc:
                    print(f"plasmid: the data is used up ({exc}); ending the run", file=sys.stderr)
                    data_state = ctx.data_source.state_dict()  # the failed get_groups consumed nothing
                    if rollout_id > start and saved != rollout_id - 1:
                        await save(rollout_id - 1)
                    break
                except Exception:
                    await keep_progress(rollout_id - 1)  # a rollout-side provider failed; re-raised
                    raise
                last = rollout_id + 1 == steps
                data_state = ctx.data_source.state_dict()  # before the next rollout takes its prompts
                in_flight = rollout(rollout_id + 1) if overlap and not last and not stop.requested else None
                rolled = time.perf_counter()
                metrics = {**first_metrics, **batch.metrics, **drop_stale(batch, version, schedule.max_staleness)}
                first_metrics = {}

                if colocated:
                    await asyncio.gather(*(engine.release_memory() for engine in session.engines))
                metrics.update(await trainer.train_step(batch) if batch.groups else {"train/skipped_steps": 1.0})
                trained = time.perf_counter()
                if colocated:
                    await asyncio.gather(*(engine.resume_memory() for engine in session.engines))
                sync_began = time.perf_counter()
                if (rollout_id + 1) % schedule.update_weights_interval == 0 or last:
                    if in_flight is not None:  # never change weights under a rollout in flight
                        await asyncio.wait([in_flight])
                    version = rollout_id + 1
                    report = await session.weight_sync.sync(trainer, session.engines, version)
                    manager.weights_synced(rollout_id, report)
                    metrics.update({"time/sync_seconds": report.seconds, "sync/bytes": float(report.bytes),
                                    **report.metrics})
                metrics.update({"time/rollout_seconds": rolled - began, "time/train_seconds": trained - rolled,
                                "weight_version": float(version)})

                sync_wall, evaluated = time.perf_counter() - sync_began, time.perf_counter()
                if eval_groups and ((rollout_id + 1) % evaluation.eval_interval == 0 or last):
                    metrics.update(await session.driver.evaluate(ctx, eval_groups, ctx.eval_sampling()))
                if clock is not None:
                    metrics.update(clock.step(metrics, sync_seconds=sync_wall,
                                              eval_seconds=time.perf_counter() - evaluated))
                target = evaluation.stop_at_eval_acc
                done = target is not None and metrics.get("eval/accuracy", -1.0) >= target
                manager.metrics(rollout_id, metrics)
                entry = log.write(rollout_id, metrics)
                stalled, stopping = stalls.observe(rollout_id, metrics, trained=bool(batch.groups)), stop.requested
                if last or done or stalled or stopping or (
                        saving.save_interval and (rollout_id + 1) % saving.save_interval == 0):
                    path = await save(rollout_id) if clock is None else await clock.saving(save(rollout_id))
                manager.step_end(rollout_id, str(config.run_dir), entry)
                if stalled:
                    raise RunStopped(f"{stalled}; checkpoint {path} written (continue with --resume)")
                if stopping:
                    if not last:
                        print(f"plasmid: stopped by {stopping} after step {rollout_id}; checkpoint {path} "
                              f"written; continue with --resume", file=sys.stderr)
                    break
                if done:
                    break
        finally:
            if in_flight is not None:
                in_flight.cancel()
    return metrics


class StepClock:
    """The ``--profile`` breakdown of each step's wall time (see the module docstring).

    Windows are contiguous: each :meth:`step` closes the window opened by the previous one (the
    first opens when the clock is made), so a run's ``time/step_seconds`` add up to its wall time
    from the first step's start to the last step's metrics.
    """

    #: the parts of a step's window that are measured, not derived
    PARTS = ("time/rollout_seconds", "time/train_seconds", "time/sync_wall_seconds", "time/eval_seconds",
             "time/checkpoint_seconds")

    def __init__(self, rewards: object | None = None) -> None:
        self.rewards = rewards
        self.opened = time.perf_counter()
        self.checkpoint_seconds = 0.0
        if callable(busy := getattr(rewards, "pop_busy_seconds", None)):
            busy()  # reward time before the first step (start-up checks) is not a step's

    def step(self, metrics: dict[str, float], *, sync_seconds: float, eval_seconds: float) -> dict[str, float]:
        """Close the window: the profile metrics of the step whose ``metrics`` hold its
        ``time/rollout_seconds`` and ``time/train_seconds``; ``sync_seconds`` and ``eval_seconds``
        are the loop's wall time of its weight sync (0 when it made none) and evaluation."""
        now = time.perf_counter()
        found = {"time/sync_wall_seconds": sync_seconds, "time/eval_seconds": eval_seconds,
                 "time/checkpoint_seconds": self.checkpoint_seconds, "time/step_seconds": now - self.opened}
        busy = getattr(self.rewards, "pop_busy_seconds", None)
        found["time/reward_seconds"] = float(busy()) if callable(busy) else 0.0
        measured = sum(metrics.get(name, found.get(name, 0.0)) for name in self.PARTS)
        found["time/overhead_seconds"] = max(0.0, found["time/step_seconds"] - measured)
        self.opened, self.checkpoint_seconds = now, 0.0
        return found

    async def saving(self, save: Awaitable[Path]) -> Path:
        """Await the checkpoint ``save``, its time counted in the next window's ``time/checkpoint_seconds``."""
        began = time.perf_counter()
        try:
            return await save
        finally:
            self.checkpoint_seconds += time.perf_counter() - began


def provider_label(session: Session, family: str, name: str | None) -> str:
    """``trainer 'x' from plugin 'y' (distribution ...)``, for messages; just the family and
    name when the registry does not know it (a runtime that builds providers elsewhere)."""
    try:
        provider = session.startup.registry.get(family, name or "")
    except PlasmidError:
        return f"{family} {name!r}"
    return f"{family} {provider.name!r} from plugin {provider.plugin.label}"


class Stalls:
    """Steps in a row that cannot learn, warned about on each and stopped after too many:

    - *bad* steps, which the trainer refused (metrics ``BAD_STEP_PREFIX + reason``, nonzero;
      weights and optimizer untouched): ``--max-bad-steps`` in a row stop the run;
    - *empty* steps, in which filters (or ``--max-staleness``) dropped every group, so nothing
      was trained: ``--max-empty-steps`` in a row stop the run.

    A step that trains normally ends both streaks; an empty step leaves the bad streak as it is.
    """

    def __init__(self, config: Config, trainer_label: str, stream: TextIO | None = None) -> None:
        faults = FaultOptions.of(config)
        self.max_bad, self.max_empty = faults.max_bad_steps, faults.max_empty_steps
        self.trainer_label = trainer_label
        self.filters = list(config.option.filter or [])
        self.max_staleness = ScheduleOptions.of(config).max_staleness
        self.stream = stream or sys.stderr
        self.bad: list[int] = []
        self.empty: list[int] = []

    def observe(self, step: int, metrics: dict[str, float], *, trained: bool) -> str | None:
        """Count step ``step``; the reason to stop the run (one line), or ``None`` to go on."""
        if not trained:
            self.empty.append(step)
            drops = ", ".join(f"{key.removeprefix('rollout/dropped/')} {value:g}" for key, value in
                              sorted(metrics.items()) if key.startswith("rollout/dropped/")) or "none counted"
            self._warn(f"WARNING: step {step}: no group was left to train on (dropped: {drops}) by "
                       f"{self._droppers()}; nothing was trained [{len(self.empty)} of --max-empty-steps "
                       f"{self.max_empty} in a row]")
            if len(self.empty) >= self.max_empty:
                return (f"stopped after {len(self.empty)} steps in a row ({_span(self.empty)}) with no group "
                        f"left to train on: {self._droppers()} dropped every group, so the run cannot learn "
                        f"(loosen them, or raise --max-empty-steps)")
            return None
        self.empty.clear()
        reasons = sorted(key.removeprefix(BAD_STEP_PREFIX) for key, value in metrics.items()
                         if key.startswith(BAD_STEP_PREFIX) and value)
        if not reasons:
            self.bad.clear()
            return None
        self.bad.append(step)
        self._warn(f"warning: step {step}: {self.trainer_label} refused the step, weights unchanged: "
                   f"{', '.join(reasons)} [{len(self.bad)} of --max-bad-steps {self.max_bad} in a row]")
        if len(self.bad) >= self.max_bad:
            return (f"stopped after {len(self.bad)} bad steps in a row ({_span(self.bad)}): {self.trainer_label} "
                    f"refused each, the last for {', '.join(reasons)}; nothing was learned from them (lower "
                    f"--lr, check the rewards for huge values, or raise --max-bad-steps)")
        return None

    def _droppers(self) -> str:
        if self.filters:
            return f"the filters ({', '.join(self.filters)}; --filter)"
        if self.max_staleness is not None:
            return f"--max-staleness {self.max_staleness}"
        return "the rollout (no --filter is set)"

    def _warn(self, text: str) -> None:
        self.stream.write(f"plasmid: {text}\n")
        self.stream.flush()


def _span(steps: list[int]) -> str:
    return f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"


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
