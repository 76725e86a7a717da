"""``plasmid rollout [train options] [--save-rollouts DIR]``: generates and scores ``--num-rollouts``
steps with the current weights (no trainer is built, the weights never change), writing each step's
rollout metrics to ``metrics.jsonl`` in the run directory, and, with ``--save-rollouts``, the
batches (:mod:`plasmid.app.rollout_store`). ``--checkpoint DIR`` (a run directory or one of its
checkpoints) rolls out the checkpoint's model with the run's ``config.json`` read first
(:mod:`plasmid.app.runconfig`; the run's own directory, saved rollouts and resume are not taken); a
run's ``config.json`` is also a valid ``--config``. One line on stderr says what is rolled out
(:func:`what_line`). A command of group ``plasmid.commands``
(``rollout = "plasmid.app.rollout:rollout_command"``).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from plasmid.app.rollout_store import SaveRolloutsOptions, saving
from plasmid.app.runconfig import data_text, with_run_config
from plasmid.app.rundir import StartupWrites, check_run_dir, write_header
from plasmid.app.runlog import RunLog
from plasmid.app.start import start
from plasmid.config import Config
from plasmid.errors import PluginError
from plasmid.kernel_options import EvalOptions, RolloutOptions
from plasmid.options import Options, option
from plasmid.protocols import RolloutEngine
from plasmid.session import build_inputs, build_rollout_context, instantiate, prepare


class RolloutCommandOptions(Options, group="plasmid rollout"):
    checkpoint: Path | None = option(None, "roll out this run's model (a run directory: its newest checkpoint, or a "
                                     "checkpoint step_N), with the run's config.json read first", metavar="DIR",
                                     default_text="--model")


async def run_rollout(argv: list[str]) -> list[dict[str, Any]]:
    """``plasmid rollout [train options]`` (see the module docstring); returns the entries written."""
    startup = start(with_run_config(argv), prog="plasmid rollout", run_configs=True,
                    description="Generate and score rollouts, without training.",
                    own_options=(RolloutCommandOptions, SaveRolloutsOptions))
    config = startup.config
    check_run_dir(config)
    print(f"run directory: {config.run_dir}", file=sys.stderr)
    print(what_line(config), file=sys.stderr, flush=True)
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
            if startup.manager.observer_failure:  # --observer-errors fail
                raise PluginError(startup.manager.observer_failure)
    finally:
        log.close()
        for engine in engines:
            await engine.shutdown()
    return entries


def what_line(config: Config) -> str:
    """The line ``plasmid rollout`` prints (stderr) before its first step: the data source and its
    training split, how many steps of how many prompts and samples, the token budget and the model."""
    rollout = RolloutOptions.of(config)
    return (f"plasmid rollout: {data_text(config.option, 'train')}, training split: {rollout.num_rollouts} steps x "
            f"{rollout.prompts_per_step} prompts x {rollout.n_samples_per_prompt} sample(s), at most "
            f"{rollout.max_new_tokens} new tokens, model {config.option.model}")


def rollout_command(argv: list[str]) -> int:
    """``plasmid rollout [train options] [--save-rollouts DIR]``: prints the last step's metrics (JSON)."""
    entries = asyncio.run(run_rollout(argv))
    print(json.dumps(entries[-1] if entries else {}))
    return 0
