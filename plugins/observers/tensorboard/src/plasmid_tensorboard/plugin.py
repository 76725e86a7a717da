"""An observer plugin: with ``--tensorboard``, every step's metrics (the entries of
``metrics.jsonl``, which stays the record of the run) are written as TensorBoard scalars, one tag
per metric name and the rollout id as the step, to ``--tensorboard-dir`` (default
``<run dir>/tensorboard``); view them with ``tensorboard --logdir <run dir>``.

Written with ``tensorboard.summary.Writer`` (numpy only; no TensorFlow, no torch). Values that
are not finite numbers are skipped. The writer opens at run start
(:func:`~plasmid.hookspecs.plasmid_run_start`), is flushed after every step and closed at run end
(:func:`~plasmid.hookspecs.plasmid_run_end`). ``--tensorboard`` without the ``tensorboard``
package installed is a one-line error at start-up, before anything is written.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Any

from plasmid import hookimpl
from plasmid.config import Config, OptionParser
from plasmid.errors import UsageError
from plasmid_tensorboard.options import TensorboardOptions

#: The open writer of the run in progress (one run per process), or ``None``.
_writer: Any = None


def event_dir(config: Config) -> Path:
    """Where this run's event files go."""
    options = TensorboardOptions.of(config)
    return options.tensorboard_dir or Path(config.run_dir) / "tensorboard"


@hookimpl
def plasmid_addoption(parser: OptionParser) -> None:
    parser.add_options(TensorboardOptions)


@hookimpl
def plasmid_configure(config: Config) -> None:
    if TensorboardOptions.of(config).tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise UsageError("--tensorboard needs the tensorboard package (pip install tensorboard)")


@hookimpl
def plasmid_run_start(config: Config, run_dir: str) -> None:
    global _writer
    if not TensorboardOptions.of(config).tensorboard:
        return
    from tensorboard.summary import Writer

    where = event_dir(config)
    where.mkdir(parents=True, exist_ok=True)
    _writer = Writer(str(where))


@hookimpl
def plasmid_metrics(step: int, metrics: dict[str, float]) -> None:
    if _writer is None:
        return
    for name, value in sorted(metrics.items()):
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            _writer.add_scalar(name, float(value), step=step)
    _writer.flush()


@hookimpl
def plasmid_run_end(run_dir: str, metrics: dict[str, float], error: str | None) -> None:
    global _writer
    if _writer is not None:
        writer, _writer = _writer, None
        writer.close()
