"""The three-beat RL loop: rollout -> train -> weight sync, with evaluation and checkpoints.

Everything it calls is a provider chosen by plugins; this file only orders the beats. With
``--schedule async`` the rollout of step k+1 runs while step k trains; weights are synced every
``--update-weights-interval`` steps, once the rollout in flight has finished.
"""

from __future__ import annotations

import asyncio
import sys
import time

from plasmid.checkpoint import Checkpoints
from plasmid.errors import DataExhausted
from plasmid.kernel_options import CheckpointOptions, EvalOptions, GeneralOptions, RolloutOptions, ScheduleOptions
from plasmid.runlog import RunLog
from plasmid.session import Session
from plasmid.types import RolloutBatch


async def train(session: Session, log: RunLog) -> dict[str, float]:
    """Run ``--num-rollouts`` steps (or until ``--stop-at-eval-acc``); returns the last metrics."""
    config, ctx, trainer, manager = session.config, session.ctx, session.trainer, session.startup.manager
    steps, schedule = RolloutOptions.of(config).num_rollouts, ScheduleOptions.of(config)
    evaluation, saving = EvalOptions.of(config), CheckpointOptions.of(config)
    checkpoints = Checkpoints(config.run_dir, keep=saving.keep_checkpoints)
    eval_groups = ctx.data_source.eval_groups() if evaluation.eval_interval else []
    colocated, overlap = schedule.placement == "colocate", schedule.schedule == "async"

    start, version = 0, 0
    if GeneralOptions.of(config).resume and (latest := checkpoints.latest()) is not None:
        meta = await checkpoints.restore(latest, trainer, ctx.data_source)
        start, version = meta["rollout_id"] + 1, meta["weight_version"]
        await session.weight_sync.sync(trainer, session.engines, version)
    log.resume_from(start)

    def rollout(rollout_id: int) -> asyncio.Task[RolloutBatch]:
        return asyncio.ensure_future(session.driver.run(ctx, rollout_id))

    async def save(rollout_id: int) -> None:
        await checkpoints.save(rollout_id, trainer, ctx.data_source,
                               {"weight_version": version, "plugin_lock": config.plugin_lock})

    metrics: dict[str, float] = {}
    in_flight: asyncio.Task[RolloutBatch] | None = None
    for rollout_id in range(start, steps):
        began = time.perf_counter()
        try:
            batch = await (in_flight or rollout(rollout_id))
        except DataExhausted as exc:
            print(f"plasmid: the data is used up ({exc}); ending the run", file=sys.stderr)
            if rollout_id > start:
                await save(rollout_id - 1)
            break
        last = rollout_id + 1 == steps
        in_flight = rollout(rollout_id + 1) if overlap and not last else None
        rolled = time.perf_counter()
        metrics = {**batch.metrics, **drop_stale(batch, version, schedule.max_staleness)}

        if colocated:
            await asyncio.gather(*(engine.release_memory() for engine in session.engines))
        metrics.update(await trainer.train_step(batch) if batch.groups else {"train/skipped_steps": 1.0})
        trained = time.perf_counter()
        if colocated:
            await asyncio.gather(*(engine.resume_memory() for engine in session.engines))
        if (rollout_id + 1) % schedule.update_weights_interval == 0 or last:
            if in_flight is not None:  # never change weights under a rollout in flight
                await asyncio.wait([in_flight])
            version = rollout_id + 1
            report = await session.weight_sync.sync(trainer, session.engines, version)
            manager.weights_synced(rollout_id, report)
            metrics.update({"time/sync_seconds": report.seconds, "sync/bytes": float(report.bytes), **report.metrics})
        metrics.update({"time/rollout_seconds": rolled - began, "time/train_seconds": trained - rolled,
                        "weight_version": float(version)})

        if eval_groups and ((rollout_id + 1) % evaluation.eval_interval == 0 or last):
            metrics.update(await session.driver.evaluate(ctx, eval_groups, ctx.eval_sampling()))
        target = evaluation.stop_at_eval_acc
        done = target is not None and metrics.get("eval/accuracy", -1.0) >= target
        manager.metrics(rollout_id, metrics)
        entry = log.write(rollout_id, metrics)
        if last or done or (saving.save_interval and (rollout_id + 1) % saving.save_interval == 0):
            await save(rollout_id)
        manager.step_end(rollout_id, str(config.run_dir), entry)
        if done:
            break
    if in_flight is not None:
        in_flight.cancel()
    return metrics


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
