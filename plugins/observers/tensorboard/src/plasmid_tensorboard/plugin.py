"""An observer plugin: with ``--tensorboard``, every step's metrics (the entries of
``metrics.jsonl``, which stays the record of the run) are written as TensorBoard scalars, one tag
per metric name and the rollout id as the step, to ``--tensorboard-dir`` (default
``<run dir>/tensorboard``); view them with ``tensorboard --logdir <run dir>``.

Each value is written as a classic scalar summary (``Summary.Value.simple_value``, the format of
``tf.summary.scalar`` in TF1 and of ``torch.utils.tensorboard``): TensorBoard's classic
``EventAccumulator`` returns it from ``.Scalars(tag)``, and TensorBoard's own loading (the scalars
dashboard, ``plugin_event_accumulator``) migrates it to its tensor form on read. (The v2 tensor
format of ``tensorboard.summary.Writer`` is invisible to the classic accumulator.) Written with
tensorboard's ``EventFileWriter`` and protos (no TensorFlow, no torch). Values that are not finite
numbers are skipped. The writer opens at run start
(:func:`~plasmid.hookspecs.plasmid_run_start`), is flushed after every step and closed at run end
(:func:`~plasmid.hookspecs.plasmid_run_end`). ``--tensorboard`` without the ``tensorboard``
package installed is a one-line error at start-up, before anything is written.
"""

from __future__ import annotations

import importlib.util
import math
import time
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
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    where = event_dir(config)
    where.mkdir(parents=True, exist_ok=True)
    _writer = EventFileWriter(str(where))


def scalar_event(step: int, metrics: dict[str, float]) -> Any:
    """One ``Event`` at ``step`` holding every finite number of ``metrics`` as a classic scalar
    (``simple_value``, float32 as TensorBoard stores it), tags sorted; ``None`` when none is finite."""
    from tensorboard.compat.proto import event_pb2, summary_pb2

    values = [summary_pb2.Summary.Value(tag=name, simple_value=float(value))
              for name, value in sorted(metrics.items())
              if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)]
    if not values:
        return None
    return event_pb2.Event(wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=values))


@hookimpl
def plasmid_metrics(step: int, metrics: dict[str, float]) -> None:
    if _writer is None:
        return
    event = scalar_event(step, metrics)
    if event is not None:
        _writer.add_event(event)
    _writer.flush()


@hookimpl
def plasmid_run_end(run_dir: str, metrics: dict[str, float], error: str | None) -> None:
    global _writer
    if _writer is not None:
        writer, _writer = _writer, None
        writer.close()
