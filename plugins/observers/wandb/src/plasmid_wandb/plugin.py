"""An observer plugin: with ``--wandb``, a Weights & Biases run holds the run's configuration
(:func:`wandb_config`: every option under its own name, flat, as ``wandb.config.lr``) and every
step's metrics (``metrics.jsonl`` stays the record of the run), logged with the rollout id as the step.

Mode (``--wandb-mode``): ``offline`` writes the W&B run under ``<run dir>/wandb/offline-run-*``
and needs no network (``wandb sync <that dir>`` uploads it later); ``online`` streams to the
server (needs ``wandb login`` or ``WANDB_API_KEY``). Unset: ``$WANDB_MODE`` if set, else online
when ``WANDB_API_KEY`` is set, else offline, so that a machine that was never configured never
waits on the network. The W&B run is started at run start
(:func:`~plasmid.hookspecs.plasmid_run_start`) and finished at run end
(:func:`~plasmid.hookspecs.plasmid_run_end`, exit code 1 when the run failed). ``--wandb``
without the ``wandb`` package is a one-line error at start-up, before anything is written.
"""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path
from typing import Any

from plasmid import hookimpl
from plasmid.config import Config, OptionParser
from plasmid.errors import UsageError
from plasmid_wandb.options import WandbOptions

#: The W&B run in progress (one per process), or ``None``.
_run: Any = None


def mode_of(options: WandbOptions, environ: dict[str, str] | None = None) -> str:
    """The mode the W&B run starts in (module docstring)."""
    environ = dict(os.environ) if environ is None else environ
    if options.wandb_mode is not None:
        return options.wandb_mode
    if environ.get("WANDB_MODE"):
        return environ["WANDB_MODE"]
    return "online" if environ.get("WANDB_API_KEY") else "offline"


def wandb_config(config: Config) -> dict[str, Any]:
    """The W&B run's config: every option of the run under its Python name (the keys of ``config.json``'s
    ``option``, values as JSON-friendly as there), with ``run_dir`` the directory the run writes to (the
    option's value, or the one chosen when it was not set), plus ``plugin_lock``, ``{plugin name:
    "distribution version"}`` of the run's plugins, unless an option has that name."""
    view = config.to_dict()
    flat: dict[str, Any] = dict(view["option"])
    flat.setdefault("plugin_lock", {entry["name"]: f"{entry['distribution']} {entry['version']}"
                                    for entry in view["plugin_lock"]})
    flat["run_dir"] = view["run_dir"]
    return flat


@hookimpl
def plasmid_addoption(parser: OptionParser) -> None:
    parser.add_options(WandbOptions)


@hookimpl
def plasmid_configure(config: Config) -> None:
    if WandbOptions.of(config).wandb and importlib.util.find_spec("wandb") is None:
        raise UsageError("--wandb needs the wandb package (pip install wandb)")


@hookimpl
def plasmid_run_start(config: Config, run_dir: str) -> None:
    global _run
    options = WandbOptions.of(config)
    if not options.wandb:
        return
    import wandb

    _run = wandb.init(project=options.wandb_project, entity=options.wandb_entity,
                      name=options.wandb_name or Path(run_dir).name, dir=run_dir, config=wandb_config(config),
                      mode=mode_of(options), settings=wandb.Settings(silent=True, console="off"))


@hookimpl
def plasmid_metrics(step: int, metrics: dict[str, float]) -> None:
    if _run is None:
        return
    values = {name: float(value) for name, value in metrics.items()
              if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)}
    _run.log(values, step=step)


@hookimpl
def plasmid_run_end(run_dir: str, metrics: dict[str, float], error: str | None) -> None:
    global _run
    if _run is not None:
        run, _run = _run, None
        run.finish(exit_code=0 if error is None else 1)
