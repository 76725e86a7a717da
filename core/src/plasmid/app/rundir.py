"""The run directory's header (``config.json``, ``plugins.lock.json``), checked before anything
is written: a new run never lands on an old one, and ``--resume`` continues the run it names.

- Without ``--resume``, a directory that already holds a run (metrics, checkpoints or a
  header) is refused: training into it would truncate ``metrics.jsonl`` and mix two runs'
  checkpoints.
- With ``--resume``, the options and the plugins the run used must be the run's own (the
  differences are listed; :func:`plasmid.app.runlock.lock_differences`: a plugin the run never
  used may come or go) unless ``--resume-allow-changes``; the header of a run with a checkpoint is never
  rewritten, so a failing resume leaves the run as it was. A directory without a complete
  checkpoint (a run killed before its first one, or no run at all) starts from step 0, saying so
  in one line: a scheduler that always restarts with ``--resume`` is never stuck.
- Either way the directory (or, when it does not exist yet, the directory it would be created
  in) must be writable; that is probed without writing anything.

:class:`StartupWrites` removes what a start-up wrote (a recipe's model, engine logs) when the
start-up fails before training begins, so a failed ``plasmid train`` leaves no run behind.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from types import TracebackType
from typing import Any

from plasmid.app.runlock import lock_differences, records_use, used_options
from plasmid.atomic import write_atomic
from plasmid.checkpoint import Checkpoints
from plasmid.config import Config
from plasmid.errors import UsageError
from plasmid.kernel_options import GeneralOptions

CONFIG_FILE = "config.json"
LOCK_FILE = "plugins.lock.json"
METRICS_FILE = "metrics.jsonl"

#: Options a resume may change without ``--resume-allow-changes``: how long to go on, when to
#: evaluate and save, and how this invocation is run, none of which changes what was trained.
RESUMABLE_CHANGES = frozenset({
    "resume", "resume_allow_changes", "debug", "plugins", "run_dir", "num_rollouts", "stop_at_eval_acc",
    "eval_interval", "save_interval", "keep_checkpoints", "max_bad_steps", "max_empty_steps", "verbose",
    "observer_errors",
})


def holds_a_run(run_dir: Path) -> list[str]:
    """What of an earlier run ``run_dir`` holds (file names), or ``[]``."""
    found = [name for name in (METRICS_FILE, CONFIG_FILE, LOCK_FILE) if (run_dir / name).exists()]
    if (run_dir / "checkpoints").is_dir() and any((run_dir / "checkpoints").iterdir()):
        found.append("checkpoints/")
    return found


def check_run_dir(config: Config) -> None:
    """Refuse, before anything is written, a new run into an old run's directory and a resume
    that cannot continue the run it names (one-line :class:`UsageError`)."""
    general, run_dir = GeneralOptions.of(config), Path(config.run_dir)
    check_writable(run_dir)
    earlier = holds_a_run(run_dir) if run_dir.is_dir() else []
    if not general.resume:
        if earlier:
            raise UsageError(f"--run-dir {run_dir} already holds a run ({', '.join(earlier)}); continue it with "
                             f"--resume, or choose a new --run-dir")
        return
    changes = differences(run_dir, config)
    if changes and not general.resume_allow_changes:
        raise UsageError(f"--resume: this run differs from the one in {run_dir}: {'; '.join(changes)}. Resume "
                         f"with the run's own options, or pass --resume-allow-changes")
    if Checkpoints(run_dir).latest() is None:
        print(f"plasmid: --resume: {run_dir} holds no complete checkpoint (nothing under "
              f"{run_dir / 'checkpoints'}); starting the run from step 0", file=sys.stderr)


def check_writable(run_dir: Path) -> None:
    """Refuse (one-line :class:`UsageError` naming the path) a run directory that cannot be
    written: one under a file, on a read-only file system, or without write permission, and in
    an existing one a ``metrics.jsonl`` or ``checkpoints/`` that cannot be written. Probed with
    ``os.access`` and ``statvfs``, which see read-only mounts and immutable files even for root;
    nothing is created."""
    existing = run_dir
    while not existing.exists() and existing != existing.parent:
        if existing.is_symlink():
            raise UsageError(f"--run-dir {run_dir}: {existing} is a broken symbolic link")
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"--run-dir {run_dir}: {existing} is a file, not a directory")
    targets = [existing]
    if existing == run_dir:
        targets += [path for path in (run_dir / METRICS_FILE, run_dir / "checkpoints") if path.exists()]
    for path in targets:
        if not os.access(path, os.W_OK | (os.X_OK if path.is_dir() else 0)):
            why = "is on a read-only file system" if _read_only(path) else "is not writable (permission denied)"
            raise UsageError(f"--run-dir {run_dir}: {path} {why}; choose a writable --run-dir")


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


class StartupWrites:
    """``with StartupWrites(run_dir):`` around the part of a start-up that writes (a recipe's
    model, providers starting): if it raises, what it created is removed, so the failed
    start-up leaves the run directory as it found it.

    When ``run_dir`` did not exist, the topmost directory created for it is removed whole;
    otherwise only the entries of ``run_dir`` that were not there on entry (an existing run's
    files are never touched). :meth:`keep` ends the guard (training has begun).
    """

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        created = None
        path = self.run_dir
        while not path.exists() and path != path.parent:
            created, path = path, path.parent
        #: the topmost directory that a start-up creates, or ``None`` when ``run_dir`` exists
        self.created = created
        self.before = set(os.listdir(self.run_dir)) if created is None and self.run_dir.is_dir() else set()
        self.active = True

    def __enter__(self) -> StartupWrites:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if kind is not None and self.active:
            self.undo()

    def keep(self) -> None:
        """Keep what was written from now on, whatever happens."""
        self.active = False

    def undo(self) -> None:
        """Remove what was created since entry (best effort: a path that cannot be removed stays)."""
        if self.created is not None:
            shutil.rmtree(self.created, ignore_errors=True)
            return
        if not self.run_dir.is_dir():
            return
        for name in sorted(set(os.listdir(self.run_dir)) - self.before):
            path = self.run_dir / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


def differences(run_dir: Path, config: Config) -> list[str]:
    """``name: saved -> now`` for every option (outside :data:`RESUMABLE_CHANGES`) that differs
    between ``run_dir``'s header and ``config``, then every difference in the plugins the run used
    (:func:`plasmid.app.runlock.lock_differences`).

    An option no loaded plugin declares now is compared only when the run set it (its lock records
    that) or, for a lock that does not record what the run used, always; an option newer than the
    run is compared only when given."""
    changes = []
    saved = _read_json(run_dir / CONFIG_FILE)
    lock = _read_json(run_dir / LOCK_FILE)
    recorded = isinstance(lock, list) and records_use(lock)
    set_by_run = used_options(lock) if recorded else {}
    if saved is not None:
        before, now = saved.get("option", {}), _normalised(config.to_dict()["option"])
        for name in sorted(set(before) | set(now)):
            if name not in before and not config.is_given(name):
                continue  # an option newer than the run, left at its default: the run's behaviour holds
            if name not in now and recorded and name not in set_by_run:
                continue  # an option of a plugin gone since, left at its default by the run
            if name not in RESUMABLE_CHANGES and before.get(name) != now.get(name):
                changes.append(f"--{name.replace('_', '-')} {_show(before.get(name))} -> {_show(now.get(name))}")
    if lock is not None:
        changes += lock_differences(lock, config.plugin_lock)
    return changes


def write_header(config: Config) -> None:
    """``config.json`` and ``plugins.lock.json`` of a new run (a resumed run keeps its own; one
    resumed without a checkpoint starts afresh and writes them again)."""
    run_dir = Path(config.run_dir)
    if (GeneralOptions.of(config).resume and (run_dir / CONFIG_FILE).exists()
            and Checkpoints(run_dir).latest() is not None):
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(run_dir / CONFIG_FILE, json.dumps(config.to_dict(), indent=1))
    write_atomic(run_dir / LOCK_FILE, json.dumps(config.plugin_lock, indent=1))


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise UsageError(f"--resume: {path} cannot be read ({exc}); the run directory is damaged") from None


def _normalised(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples become lists)."""
    return json.loads(json.dumps(value))


def _show(value: Any) -> str:
    return "unset" if value is None else json.dumps(value)
