"""What a run writes and shows: ``metrics.jsonl``, the reward curve (``reward_curve.svg``), progress on the terminal.

Progress: on a terminal, one ``tqdm`` bar (steps done, elapsed, ETA, rate, and the
:data:`PROGRESS_FIELDS` of the last step), redrawn in place on the stream (stderr); when the
stream is no terminal (a log file, a pipe, CI), no bar: one plain line every 10 steps and after
each evaluation. Without ``tqdm`` installed the terminal gets a plain bar of its own. The
progress never changes what is written to ``metrics.jsonl``.
"""

from __future__ import annotations

import importlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from plasmid.app.curve import render_entries
from plasmid.atomic import append_line, fsync_file, write_atomic
from plasmid.errors import PlasmidError

#: The curve's file name in the run directory.
CURVE_FILE = "reward_curve.svg"
#: Metrics shown in the progress line, by short label.
PROGRESS_FIELDS = {"reward": "rollout/reward_mean", "eval_acc": "eval/accuracy", "entropy": "train/entropy"}


class RunLog:
    """Appends one JSON object per step to ``metrics.jsonl`` and keeps the curve and progress.

    A resumed run appends: entries for steps at or after the resume point are dropped first,
    so the file always reads as one uninterrupted run. The curve is drawn when the run ends and,
    before that, on a step that is a multiple of ``plot_every`` once ``plot_seconds`` have passed
    since the log was made or last drew (:mod:`plasmid.app.curve` draws in about a millisecond, but
    a redraw writes and renames a file, which a fast loop need not do every step).
    """

    def __init__(self, run_dir: Path, total_steps: int, stream: TextIO | None = None,
                 plot_every: int = 10, plot_seconds: float = 60.0) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / "metrics.jsonl"
        self.total_steps = total_steps
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.plot_every = max(1, plot_every)
        self.plot_seconds = plot_seconds
        self.plotted_at: float | None = None
        self.history: list[dict[str, Any]] = []
        self.started = time.perf_counter()
        self.bar: Any = None  # the tqdm bar, made at the first step shown on a terminal

    def resume_from(self, first_step: int) -> None:
        """Keep the entries before ``first_step`` (a resumed run continues after them); the
        file is rewritten atomically. A torn last line (a crash or a full disk while it was
        appended) is dropped with a warning; damage anywhere else is a :class:`PlasmidError`."""
        if self.path.is_file():
            kept = read_entries(self.path, self.stream)
            self.history = [entry for entry in kept if entry["step"] < first_step]
            write_atomic(self.path, "".join(json.dumps(entry) + "\n" for entry in self.history))

    def write(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        """Append step ``step``'s entry to ``metrics.jsonl`` and show progress. The line is not
        fsynced here (about 0.3 ms a step): :meth:`make_durable` does that before each checkpoint
        and when the log closes, so a checkpoint never outlives the metrics of its steps."""
        entry = {"step": step, **{k: _jsonable(v) for k, v in sorted(metrics.items())}}
        self.history.append(entry)
        append_line(self.path, json.dumps(entry))
        self._progress(step, entry)
        last = self.started if self.plotted_at is None else self.plotted_at
        due = time.perf_counter() - last >= self.plot_seconds
        if (step % self.plot_every == 0 and due and step > 0) or step + 1 == self.total_steps:
            self.plot()
        return entry

    def _progress(self, step: int, entry: dict[str, Any]) -> None:
        parts = [f"{label} {entry[key]:.3f}" for label, key in PROGRESS_FIELDS.items()
                 if isinstance(entry.get(key), float)]
        elapsed = time.perf_counter() - self.started
        if self.tty and self._tqdm_bar(step) is not None:
            self.bar.set_postfix_str("  ".join(parts), refresh=False)
            self.bar.update(step + 1 - self.bar.n)
        elif self.tty:
            done = (step + 1) / self.total_steps
            bar = "#" * int(30 * done) + "-" * (30 - int(30 * done))
            self.stream.write(f"\r[{bar}] {step + 1}/{self.total_steps} {elapsed:5.0f}s  " + "  ".join(parts) + "  ")
            self.stream.flush()
        elif step % 10 == 0 or "eval/accuracy" in entry:
            self.stream.write(f"step {step:5d} t={elapsed:7.1f}s " + " ".join(parts) + "\n")
            self.stream.flush()

    def _tqdm_bar(self, step: int) -> Any:
        """The tqdm bar (made on first use, starting at ``step``), or ``None`` without tqdm."""
        if self.bar is None:
            try:
                tqdm = importlib.import_module("tqdm").tqdm
            except ImportError:
                return None
            self.bar = tqdm(total=self.total_steps, initial=step, file=self.stream, unit="step",
                            dynamic_ncols=True, mininterval=0.5, leave=True)
        return self.bar

    def note(self, line: str) -> None:
        """Write ``line`` (no newline) above the progress: through the tqdm bar, which redraws below it,
        or after the plain bar's line; safe to call from another thread as a whole line."""
        if self.bar is not None:
            self.bar.write(line, file=self.stream)
            return
        self.stream.write(("\n" if self.tty and self.history else "") + line + "\n")
        self.stream.flush()

    def last_metrics(self) -> dict[str, float]:
        """The last step's entry without its ``step`` (empty before the first)."""
        if not self.history:
            return {}
        return {k: v for k, v in self.history[-1].items() if k != "step"}

    def make_durable(self) -> None:
        """fsync ``metrics.jsonl`` (the loop calls this before writing a checkpoint)."""
        if self.path.exists():
            fsync_file(self.path)

    def close(self) -> None:
        """Make the log durable and draw the curve; neither failing stops the caller's cleanup
        (a warning line each: every checkpoint already made the metrics before it durable)."""
        try:
            self.make_durable()
        except OSError as exc:
            self.stream.write(f"plasmid: warning: {self.path} may not be on disk: {exc}\n")
        self.plot()
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        elif self.tty:
            self.stream.write("\n")

    def plot(self) -> Path | None:
        """Redraw ``reward_curve.svg`` (reward and eval accuracy, loss, KL, response length and
        tokens/s per step, those logged, see :mod:`plasmid.app.curve`), atomically; a file that
        cannot be written is a one-line warning (the curve is redrawn from the metrics; losing it
        never stops a run)."""
        self.plotted_at = time.perf_counter()
        target = self.run_dir / CURVE_FILE
        try:
            write_atomic(target, render_entries(self.run_dir.name, self.history))
        except OSError as exc:
            self.stream.write(f"plasmid: warning: the reward curve was not drawn: {exc}\n")
            return None
        return target


def read_entries(path: Path, warn: TextIO | None = None) -> list[dict[str, Any]]:
    """The entries of a ``metrics.jsonl``; a torn last line is dropped (with a warning on
    ``warn``), any other line that is not a JSON object with a ``step`` is a :class:`PlasmidError`
    naming the file and line."""
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    entries = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            if not isinstance(entry, dict) or not isinstance(entry.get("step"), int):
                raise ValueError("not an object with an integer 'step'")
        except ValueError as exc:
            if number == len(lines):
                (warn or sys.stderr).write(f"plasmid: warning: {path}: dropped a torn last line {number} "
                                           f"({len(line)} characters; a crash or a full disk while it was "
                                           f"written)\n")
                break
            raise PlasmidError(f"{path}, line {number}: not a metrics entry ({exc}); the run's log is "
                               f"damaged") from None
        entries.append(entry)
    return entries


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):
        return value.item()
    return value
