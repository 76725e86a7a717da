"""The three-beat RL loop: rollout -> train -> weight sync, with evaluation and checkpoints.

Everything it calls is a provider chosen by plugins; this file only orders the beats.
"""

from __future__ import annotations

import sys
import time

from plasmid.checkpoint import Checkpoints
from plasmid.errors import DataExhausted
from plasmid.runlog import RunLog
from plasmid.session import Session


async def train(session: Session, log: RunLog) -> dict[str, float]:
    """Run ``--num-rollouts`` steps (or until ``--stop-at-eval-acc``); returns the last metrics."""
    config, ctx = session.config, session.ctx
    option = config.option
    checkpoints = Checkpoints(config.run_dir, keep=option.keep_checkpoints)
    eval_groups = ctx.data_source.eval_groups() if option.eval_interval else []

    start = 0
    if option.resume and (latest := checkpoints.latest()) is not None:
        meta = await checkpoints.restore(latest, session.trainer, ctx.data_source)
        start = meta["rollout_id"] + 1
        await session.weight_sync.sync(session.trainer, session.engines, start)
    log.resume_from(start)

    async def save(rollout_id: int) -> None:
        await checkpoints.save(rollout_id, session.trainer, ctx.data_source,
                               {"weight_version": rollout_id + 1, "plugin_lock": config.plugin_lock})

    metrics: dict[str, float] = {}
    for rollout_id in range(start, option.num_rollouts):
        began = time.perf_counter()
        try:
            batch = await session.driver.run(ctx, rollout_id)
        except DataExhausted as exc:
            print(f"plasmid: the data is used up ({exc}); ending the run", file=sys.stderr)
            if rollout_id > start:
                await save(rollout_id - 1)
            break
        rolled = time.perf_counter()
        metrics = {**batch.metrics, **await session.trainer.train_step(batch)}
        trained = time.perf_counter()
        report = await session.weight_sync.sync(session.trainer, session.engines, rollout_id + 1)
        session.startup.manager.weights_synced(rollout_id, report)
        metrics.update({"time/rollout_seconds": rolled - began, "time/train_seconds": trained - rolled,
                        "time/sync_seconds": report.seconds, "sync/bytes": float(report.bytes)})

        last = rollout_id + 1 == option.num_rollouts
        if eval_groups and ((rollout_id + 1) % option.eval_interval == 0 or last):
            metrics.update(await session.driver.evaluate(ctx, eval_groups, ctx.eval_sampling()))
        done = option.stop_at_eval_acc is not None and metrics.get("eval/accuracy", -1.0) >= option.stop_at_eval_acc
        session.startup.manager.metrics(rollout_id, metrics)
        entry = log.write(rollout_id, metrics)

        if last or done or (option.save_interval and (rollout_id + 1) % option.save_interval == 0):
            await save(rollout_id)
        session.startup.manager.step_end(rollout_id, str(config.run_dir), entry)
        if done:
            break
    return metrics
