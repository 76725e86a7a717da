"""``plasmid rollout [train options] [--save-rollouts DIR]``: generates and scores ``--num-rollouts``
steps with the current weights (no trainer is built, the weights never change), writing each step's
rollout metrics to ``metrics.jsonl`` in the run directory, and, with ``--save-rollouts``, the
batches (:mod:`plasmid.app.rollout_store`). A command of group ``plasmid.commands``
(``rollout = "plasmid.app.rollout:rollout_command"``).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from plasmid.app.rollout_store import add_save_option, saving
from plasmid.app.rundir import StartupWrites, check_run_dir, write_header
from plasmid.app.runlog import RunLog
from plasmid.app.start import start
from plasmid.kernel_options import EvalOptions, RolloutOptions
from plasmid.protocols import RolloutEngine
from plasmid.session import build_inputs, build_rollout_context, instantiate, prepare


async def run_rollout(argv: list[str]) -> list[dict[str, Any]]:
    """``plasmid rollout [train options]`` (see the module docstring); returns the entries written."""
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


def rollout_command(argv: list[str]) -> int:
    """``plasmid rollout [train options] [--save-rollouts DIR]``: prints the last step's metrics (JSON)."""
    entries = asyncio.run(run_rollout(argv))
    print(json.dumps(entries[-1] if entries else {}))
    return 0
