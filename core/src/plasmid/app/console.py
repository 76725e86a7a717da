"""What a run shows on the terminal besides its progress: slow phases, and where library output goes.

Phases (:class:`Phase`): a phase of a run that prints nothing of its own (building the tiny model
and its supervised warm start, loading the model and data, starting the engines and the trainer,
an evaluation, a checkpoint) announces itself once it has run for :data:`PHASE_AFTER` seconds,
``plasmid: starting the runtime...``, and says when it is done, ``plasmid: starting the runtime:
done in 12.3 s``. A shorter phase shows nothing.

Library output (:class:`LibraryLogs`): while a run is on, Python ``warnings`` and the records of
library loggers (transformers, torch and torch.distributed with DCP, megatron, sglang, vllm, ray,
...) go to ``<run dir>/run.log`` (:data:`LOG_FILE`, appended on ``--resume``), with their time,
level and logger. The terminal keeps plasmid's own lines: records of loggers named ``plasmid*``
at WARNING and above, as before. With ``--verbose`` or ``--debug`` the terminal also shows every
library record and warning at WARNING and above. Output of other processes (engine servers, Ray
workers) is theirs, not routed here.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

#: The run directory's log file of library messages.
LOG_FILE = "run.log"
#: Seconds a phase runs before it announces itself.
PHASE_AFTER = 1.0
#: Library loggers that may carry a terminal handler of their own (transformers installs one and
#: stops propagation); it is detached while a run is on, so their records reach the log file.
LIBRARY_LOGGERS = ("transformers", "torch", "megatron", "sglang", "vllm", "ray", "datasets", "huggingface_hub",
                   "accelerate", "peft", "urllib3", "httpx", "filelock", "absl")


class Phase:
    """``with Phase("loading the model"):`` (or ``async with`` code inside it): after ``after``
    seconds still inside, one line ``plasmid: WHAT...`` goes to ``write``; on leaving a phase that
    announced itself, ``plasmid: WHAT: done in S s`` (or ``failed after S s``). ``write`` takes a
    line without its newline (default: stderr); it is called from a timer thread for the first line."""

    def __init__(self, what: str, write: Callable[[str], None] | None = None, after: float = PHASE_AFTER) -> None:
        self.what, self.after = what, after
        self.write = write or _stderr_line
        self.lock = threading.Lock()
        self.announced = False
        self.timer: threading.Timer | None = None
        self.began = 0.0

    def _announce(self) -> None:
        with self.lock:
            if self.timer is None:   # already left
                return
            self.announced = True
        self.write(f"plasmid: {self.what}...")

    def __enter__(self) -> Phase:
        self.began = time.perf_counter()
        self.timer = threading.Timer(self.after, self._announce)
        self.timer.daemon = True
        self.timer.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        with self.lock:
            timer, self.timer = self.timer, None
        if timer is not None:
            timer.cancel()
        if self.announced:
            seconds = time.perf_counter() - self.began
            self.write(f"plasmid: {self.what}: {'done in' if kind is None else 'failed after'} {seconds:.1f} s")


def _stderr_line(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


class ReportingDriver:
    """A rollout driver whose evaluations are :class:`Phase` s (``evaluating N prompt groups``);
    rollouts pass through unchanged (their progress is the step's)."""

    def __init__(self, inner: Any, write: Callable[[str], None] | None = None) -> None:
        self.inner, self.write = inner, write

    async def run(self, ctx: Any, rollout_id: int) -> Any:
        return await self.inner.run(ctx, rollout_id)

    async def evaluate(self, ctx: Any, groups: list[Any], params: Any) -> dict[str, float]:
        with Phase(f"evaluating {len(groups)} prompt groups", self.write):
            result: dict[str, float] = await self.inner.evaluate(ctx, groups, params)
        return result


def report_checkpoints(trainer: Any, write: Callable[[str], None] | None = None) -> None:
    """Make ``trainer.save(path)`` a :class:`Phase` (``writing checkpoint PATH``): the method is
    replaced on the instance, so every caller (the loop's checkpoints) reports a slow save."""
    save = trainer.save

    async def reported_save(path: str, *args: Any, **kwargs: Any) -> Any:
        with Phase(f"writing checkpoint {Path(path).parent.name}", write):
            return await save(path, *args, **kwargs)

    trainer.save = reported_save


class _Terminal(logging.Filter):
    """Passes plasmid's own records (loggers named ``plasmid*``), or every record when ``show_all``."""

    def __init__(self, show_all: bool) -> None:
        super().__init__()
        self.show_all = show_all

    def filter(self, record: logging.LogRecord) -> bool:
        return self.show_all or record.name.startswith("plasmid")


class LibraryLogs:
    """``with LibraryLogs(run_dir, show_all=...) as logs:`` around a run; :meth:`start` (once the run
    directory may be written) routes warnings and library loggers to ``run_dir/run.log`` (module
    docstring), :meth:`detach` again after code that may have configured a library's logging (a
    library imported late), and leaving restores the logging set-up found on :meth:`start`."""

    def __init__(self, run_dir: Path, show_all: bool = False, stream: TextIO | None = None) -> None:
        self.path = Path(run_dir) / LOG_FILE
        self.show_all, self.stream = show_all, stream
        self.file: logging.Handler | None = None
        self.terminal: logging.Handler | None = None
        self.root_level = logging.WARNING
        self.captured = False
        self.detached: list[tuple[logging.Logger, logging.Handler]] = []
        self.propagation: list[tuple[logging.Logger, bool]] = []
        self.levels: list[tuple[logging.Logger, int]] = []

    def __enter__(self) -> LibraryLogs:
        return self

    def start(self) -> None:
        """Open the log file (appending) and route to it; the run directory is created if missing."""
        if self.file is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = logging.FileHandler(self.path, mode="a", encoding="utf-8")
        self.file.setLevel(logging.INFO)
        self.file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        self.terminal = logging.StreamHandler(self.stream or sys.stderr)
        self.terminal.setLevel(logging.WARNING)
        self.terminal.addFilter(_Terminal(self.show_all))
        root = logging.getLogger()
        self.root_level = root.level
        if root.level > logging.INFO:
            root.setLevel(logging.INFO)
        root.addHandler(self.file)
        root.addHandler(self.terminal)
        self.captured = logging._warnings_showwarning is None  # type: ignore[attr-defined]
        if self.captured:
            logging.captureWarnings(True)
        self.detach()

    def detach(self) -> None:
        """Detach the terminal handlers of :data:`LIBRARY_LOGGERS` and their descendants (torch.distributed
        has a handler of its own), let them propagate to the root logger (and so to the file), and lower
        a level above WARNING to WARNING (plasmid-torch sets transformers' verbosity to errors to keep the
        terminal clean; its warnings belong in the file); idempotent, a no-op before :meth:`start`."""
        if self.file is None:
            return
        terminals = {id(stream) for stream in (sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__)}
        known = [name for name, logger in list(logging.Logger.manager.loggerDict.items())
                 if isinstance(logger, logging.Logger) and name.startswith(tuple(f"{n}." for n in LIBRARY_LOGGERS))]
        for name in (*LIBRARY_LOGGERS, *known):
            logger = logging.getLogger(name)
            for handler in list(logger.handlers):
                if type(handler) is logging.StreamHandler and id(handler.stream) in terminals:
                    logger.removeHandler(handler)
                    self.detached.append((logger, handler))
            if not logger.propagate:
                self.propagation.append((logger, logger.propagate))
                logger.propagate = True
            if logger.level > logging.WARNING:
                self.levels.append((logger, logger.level))
                logger.setLevel(logging.WARNING)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.file is None:
            return
        root = logging.getLogger()
        root.removeHandler(self.file)
        if self.terminal is not None:
            root.removeHandler(self.terminal)
        self.file.close()
        root.setLevel(self.root_level)
        if self.captured:
            logging.captureWarnings(False)
        for logger, handler in reversed(self.detached):
            logger.addHandler(handler)
        for logger, propagate in reversed(self.propagation):
            logger.propagate = propagate
        for logger, level in reversed(self.levels):
            logger.setLevel(level)
        self.file = self.terminal = None
        self.detached, self.propagation, self.levels = [], [], []
