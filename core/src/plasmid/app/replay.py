"""``plasmid replay DIR``: train on rollouts saved with ``--save-rollouts`` (:mod:`plasmid.app.rollout_store`).

``plasmid replay DIR [train options]`` trains on the steps saved in ``DIR`` (``0`` to
``--num-rollouts - 1``, each must be there) with no engine and no generation: the same loop as
``plasmid train`` (:func:`plasmid.loop.train`), whose rollout driver reads the saved step, whose
weight sync has no engine to update, and with evaluation off. Given the options of the original
run (same ``--seed``, model, loss and trainer options), it reproduces that run's losses and
every other ``train/`` metric bit for bit: the trainer sees the same batches in the same order.
A command of group ``plasmid.commands`` (``replay = "plasmid.app.replay:replay_command"``).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from plasmid.app.rollout_store import RolloutStore, SaveRolloutsOptions
from plasmid.app.run import announce, observed_train
from plasmid.app.rundir import StartupWrites, check_run_dir, write_header
from plasmid.app.runlog import RunLog
from plasmid.app.start import start
from plasmid.app.summary import add_train_options
from plasmid.errors import UsageError
from plasmid.kernel_options import RolloutOptions
from plasmid.protocols import RolloutView, Trainer
from plasmid.session import Session, build_inputs, build_rollout_context, instantiate, prepare
from plasmid.types import Group, RolloutBatch, SamplingParams, SyncReport


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
    if not argv or argv[0].startswith("-"):
        raise UsageError("plasmid replay DIR [train options]: give the directory of saved rollouts first "
                         "(what --save-rollouts wrote)")
    store = RolloutStore(argv[0])
    startup = start(argv[1:], prog="plasmid replay", description="Train on saved rollouts, with no engine.",
                    add_options=add_train_options)  # so that the original run's config.json is a valid --config
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
        await announce(session)
    log = RunLog(config.run_dir, steps, plot_every=10)
    try:
        return await observed_train(session, log)
    finally:
        log.close()
        await session.shutdown()


def replay_command(argv: list[str]) -> int:
    """``plasmid replay DIR [train options]``: exit status 0 once the replay finished."""
    if "-h" in argv or "--help" in argv:  # the train options (argparse exits 0)
        start(["--help"], prog="plasmid replay DIR",
              description="Train on the rollouts that --save-rollouts wrote to DIR, with no engine; with the "
                          "original run's options (same --seed) the losses are the original's, bit for bit.")
        return 0
    metrics = asyncio.run(run_replay(argv))
    summary = {k: v for k, v in metrics.items() if k.startswith(("train/loss", "rollout/reward_mean"))}
    print("final: " + json.dumps(summary), file=sys.stderr)
    return 0
