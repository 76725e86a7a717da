"""``plasmid train``: start up, write the run directory's header files, build, loop, shut down."""

from __future__ import annotations

import json
import sys

from plasmid import loop
from plasmid.families import FAMILIES
from plasmid.kernel_options import EvalOptions, RolloutOptions
from plasmid.rundir import check_run_dir, write_header
from plasmid.runlog import RunLog
from plasmid.session import instantiate
from plasmid.startup import Startup, start


def describe_plugins(startup: Startup) -> str:
    """The resolved plugin set and provider choices, as printed at the start of a run."""
    option = startup.config.option
    lines = ["plasmid plugins:"]
    for entry in startup.config.plugin_lock:
        lines.append(f"  {entry['name']:<14} {entry['distribution']} {entry['version']}")
    chosen = {}
    for family in FAMILIES:
        value = getattr(option, family.option, None)
        if family.name != "runtime":
            chosen[family.flag[2:]] = (",".join(value) or "-") if isinstance(value, list) else value
    lines.append("providers: " + "  ".join(f"{k}={v}" for k, v in chosen.items()))
    return "\n".join(lines)


async def run_training(argv: list[str]) -> dict[str, float]:
    startup = start(argv)
    config = startup.config
    print(describe_plugins(startup), file=sys.stderr)
    check_run_dir(config)
    print(f"run directory: {config.run_dir}", file=sys.stderr)
    write_header(config)
    runtime = instantiate(startup.registry.get("runtime", config.option.runtime), config)
    session = await runtime.start(startup)
    log = RunLog(config.run_dir, RolloutOptions.of(config).num_rollouts,
                 plot_every=max(1, EvalOptions.of(config).eval_interval or 10))
    try:
        metrics = await loop.train(session, log)
    finally:
        log.close()
        await session.shutdown()
    summary = {k: v for k, v in metrics.items() if k.startswith(("eval/", "rollout/reward_mean"))}
    print("final: " + json.dumps(summary), file=sys.stderr)
    return metrics
