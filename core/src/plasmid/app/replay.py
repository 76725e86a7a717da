"""``--save-rollouts``, ``plasmid rollout`` and ``plasmid replay``: rollouts saved and trained on again.

- ``plasmid train --save-rollouts DIR``: every step's batch, as the rollout driver returned it
  (before ``--max-staleness`` drops any group), is written to ``DIR`` in the format of
  :mod:`plasmid.rollout_store` (one file per step) before the trainer sees it.
- ``plasmid rollout [train options] [--save-rollouts DIR]``: generates and scores
  ``--num-rollouts`` steps with the current weights (no trainer is built, the weights never
  change), writing each step's rollout metrics to ``metrics.jsonl`` in the run directory.
- ``plasmid replay DIR [train options]``: trains on the steps saved in ``DIR`` (``0`` to
  ``--num-rollouts - 1``, each must be there) with no engine and no generation: the same loop as
  ``plasmid train`` (:func:`plasmid.loop.train`), whose rollout driver reads the saved step, whose
  weight sync has no engine to update, and with evaluation off. Given the options of the original
  run (same ``--seed``, model, loss and trainer options), it reproduces that run's losses and
  every other ``train/`` metric bit for bit: the trainer sees the same batches in the same order.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from plasmid.config import Config, OptionParser
from plasmid.errors import UsageError
from plasmid.kernel_options import EvalOptions, RolloutOptions
from plasmid.options import Options, option
from plasmid.protocols import RolloutDriver, RolloutEngine, RolloutView, Trainer
from plasmid.rollout_store import RolloutStore
from plasmid.types import Group, RolloutBatch, SamplingParams, SyncReport


class SaveRolloutsOptions(Options, group="saved rollouts"):
    save_rollouts: Path | None = option(None, "write every step's groups (tokens, loss masks, log-probs, rewards, "
                                        "metadata) to DIR, one file per step (see plasmid.rollout_store)",
                                        metavar="DIR", default_text="not saved")

    def check(self) -> None:
        if self.save_rollouts is not None and self.save_rollouts.exists() and not self.save_rollouts.is_dir():
            raise UsageError(f"--save-rollouts {self.save_rollouts}: is a file, not a directory")


def add_save_option(parser: OptionParser) -> None:
    """``--save-rollouts DIR`` (``plasmid train``, ``plasmid rollout``)."""
    parser.add_options(SaveRolloutsOptions)


class SavingDriver:
    """A rollout driver that saves each batch that ``inner`` returns to ``store``, then returns it."""

    def __init__(self, inner: RolloutDriver, store: RolloutStore) -> None:
        self.inner, self.store = inner, store

    async def run(self, ctx: RolloutView, rollout_id: int) -> RolloutBatch:
        batch = await self.inner.run(ctx, rollout_id)
        await asyncio.to_thread(self.store.save, batch)
        return batch

    async def evaluate(self, ctx: RolloutView, groups: list[Group], params: SamplingParams) -> dict[str, float]:
        return await self.inner.evaluate(ctx, groups, params)


def saving(driver: RolloutDriver, config: Config) -> RolloutDriver:
    """``driver``, saving its batches when ``--save-rollouts`` is given (the directory is made now)."""
    where = SaveRolloutsOptions.of(config).save_rollouts
    if where is None:
        return driver
    store = RolloutStore(where)
    store.check_writable()
    return SavingDriver(driver, store)


class ReplayDriver:
    """A rollout driver that returns the saved step instead of generating one."""

    def __init__(self, store: RolloutStore) -> None:
        self.store = store

    async def run(self, ctx: RolloutView, rollout_id: int) -> RolloutBatch:
        return await asyncio.to_thread(self.store.load, rollout_id)

    async def evaluate(self, ctx: RolloutView, groups: list[Group], params: SamplingParams) -> dict[str, float]:
        raise UsageError("plasmid replay has no engine to evaluate with")


class NoEngineSync:
    """The weight sync of a replay: no engine to update; reports the new version only."""

    async def sync(self, trainer: Trainer, engines: Any, weight_version: int) -> SyncReport:
        return SyncReport(bytes=0, seconds=0.0, weight_version=weight_version)


async def run_replay(argv: list[str]) -> dict[str, float]:
    """``plasmid replay DIR [train options]`` (see the module docstring); returns the last metrics."""
    from plasmid.run import observed_train
    from plasmid.rundir import StartupWrites, check_run_dir, write_header
    from plasmid.runlog import RunLog
    from plasmid.session import Session, build_inputs, build_rollout_context, instantiate, prepare
    from plasmid.startup import start

    if not argv or argv[0].startswith("-"):
        raise UsageError("plasmid replay DIR [train options]: give the directory of saved rollouts first "
                         "(what --save-rollouts wrote)")
    store = RolloutStore(argv[0])
    startup = start(argv[1:], prog="plasmid replay", description="Train on saved rollouts, with no engine.",
                    add_options=add_save_option)  # so that the original run's config.json is a valid --config
    config = startup.config
    if SaveRolloutsOptions.of(config).save_rollouts is not None:
        print("plasmid: note: plasmid replay saves no rollouts; --save-rollouts is ignored", file=sys.stderr)
    config.option.eval_interval = 0  # no engine to evaluate with
    steps = RolloutOptions.of(config).num_rollouts
    store.check_readable(0, steps - 1)
    check_run_dir(config)
    print(f"run directory: {config.run_dir}", file=sys.stderr)
    option, registry = config.option, startup.registry
    with StartupWrites(Path(config.run_dir)):
        prepare(config, registry)
        build_inputs(startup)
        loss = instantiate(registry.get("loss", option.loss), config)
        session = Session(
            startup=startup,
            ctx=build_rollout_context(config, registry, engines=[], prebuilt=startup.prebuilt),
            driver=ReplayDriver(store),
            trainer=instantiate(registry.get("trainer", option.trainer), config, loss),
            weight_sync=NoEngineSync(),
        )
        write_header(config)
    log = RunLog(config.run_dir, steps, plot_every=10)
    try:
        return await observed_train(session, log)
    finally:
        log.close()
        await session.shutdown()


async def run_rollout(argv: list[str]) -> list[dict[str, Any]]:
    """``plasmid rollout [train options]`` (see the module docstring); returns the entries written."""
    from plasmid.rundir import StartupWrites, check_run_dir, write_header
    from plasmid.runlog import RunLog
    from plasmid.session import build_inputs, build_rollout_context, instantiate, prepare
    from plasmid.startup import start

    startup = start(argv, prog="plasmid rollout", description="Generate and score rollouts, without training.",
                    add_options=add_save_option)
    config = startup.config
    check_run_dir(config)
    print(f"run directory: {config.run_dir}", file=sys.stderr)
    registry = startup.registry
    with StartupWrites(Path(config.run_dir)):
        prepare(config, registry)
        build_inputs(startup)
        ctx = build_rollout_context(config, registry, prebuilt=startup.prebuilt)
        driver = saving(instantiate(registry.get("rollout", config.option.rollout), config), config)
        write_header(config)
    steps = RolloutOptions.of(config).num_rollouts
    log = RunLog(config.run_dir, steps, plot_every=max(1, EvalOptions.of(config).eval_interval or 10))
    engines: list[RolloutEngine] = list(ctx.engines)
    entries = []
    try:
        for rollout_id in range(steps):
            batch = await driver.run(ctx, rollout_id)
            entry = log.write(rollout_id, batch.metrics)
            startup.manager.metrics(rollout_id, batch.metrics)
            entries.append(entry)
    finally:
        log.close()
        for engine in engines:
            await engine.shutdown()
    return entries


def replay_command(argv: list[str]) -> int:
    """``plasmid replay DIR [train options]``: exit status 0 once the replay finished."""
    if "-h" in argv or "--help" in argv:  # the train options (argparse exits 0)
        from plasmid.startup import start

        start(["--help"], prog="plasmid replay DIR",
              description="Train on the rollouts that --save-rollouts wrote to DIR, with no engine; with the "
                          "original run's options (same --seed) the losses are the original's, bit for bit.")
        return 0
    metrics = asyncio.run(run_replay(argv))
    summary = {k: v for k, v in metrics.items() if k.startswith(("train/loss", "rollout/reward_mean"))}
    print("final: " + json.dumps(summary), file=sys.stderr)
    return 0


def rollout_command(argv: list[str]) -> int:
    """``plasmid rollout [train options] [--save-rollouts DIR]``: prints the last step's metrics (JSON)."""
    entries = asyncio.run(run_rollout(argv))
    print(json.dumps(entries[-1] if entries else {}))
    return 0
