"""Atomic checkpoints of a run: trainer state, data-source state and the loop's position.

Layout under ``<run_dir>/checkpoints/``::

    step_000010/            a complete checkpoint (has meta.json)
        trainer/            written by Trainer.save (HF model, optimizer, RNG)
        data_source.json    DataSource.state_dict()
        meta.json           {"rollout_id", "weight_version", "plugin_lock", ...}
        in_flight.json      --schedule async: the next step's rollout, finished (its RolloutBatch)
    step_000020.partial/    being written; never read, removed on the next save

A checkpoint is written under a ``.partial`` name, fsynced (every file and directory, the
trainer's included) and renamed when complete, so a crash (of a reward plugin, an engine, the
machine) or a full disk during a save never leaves a directory that resume would pick up
half-written, and never touches the previous complete checkpoint: old ones are pruned only after
the new one is in place. A failed save removes its partial directory (freeing the space it took)
and raises: an ``OSError`` naming the path, or a :class:`~plasmid.errors.CheckpointError` when the
trainer's own save failed otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from plasmid.atomic import fsync_dir, fsync_tree
from plasmid.errors import CheckpointError
from plasmid.groups import group_from_state, group_to_state
from plasmid.protocols import DataSource, Trainer
from plasmid.types import RolloutBatch

PARTIAL_SUFFIX = ".partial"

#: A trainer's save that fails with this little space left on its file system is reported as a
#: full disk (its own error, from torch or safetensors, rarely says so).
FULL_BELOW_BYTES = 1024**2


class Checkpoints:
    """Saves and finds the checkpoints of one run directory, keeping the newest ``keep``.

    ``trainer_label`` (``trainer 'x' from plugin ...``) names the trainer in save errors.
    """

    def __init__(self, run_dir: Path, keep: int = 2, trainer_label: str = "the trainer") -> None:
        self.root = Path(run_dir) / "checkpoints"
        self.keep = max(1, keep)
        self.trainer_label = trainer_label

    def complete(self) -> list[Path]:
        """Complete checkpoints (a directory with a readable ``meta.json``), oldest first."""
        if not self.root.is_dir():
            return []
        found = {}
        for path in self.root.iterdir():
            if path.is_dir() and not path.name.endswith(PARTIAL_SUFFIX) and (meta := _read_meta(path)) is not None:
                found[path] = meta["rollout_id"]
        return sorted(found, key=found.__getitem__)

    def latest(self) -> Path | None:
        done = self.complete()
        return done[-1] if done else None

    async def save(self, rollout_id: int, trainer: Trainer, data_state: dict[str, Any],
                   extra: dict[str, Any], in_flight: RolloutBatch | None = None) -> Path:
        """Write the checkpoint taken after step ``rollout_id`` durably, then prune old ones.

        ``data_state`` is ``DataSource.state_dict()`` as it was when step ``rollout_id``'s
        rollout had finished (with ``--schedule async`` the next rollout has taken its prompts
        by the time the step is saved; resuming must give those prompts again).

        On failure nothing complete is touched: the partial directory is removed and the error
        raised (see the module's docstring)."""
        final = self.root / f"step_{rollout_id:06d}"
        partial = final.with_name(final.name + PARTIAL_SUFFIX)
        for stale in self.root.glob(f"*{PARTIAL_SUFFIX}") if self.root.is_dir() else []:
            shutil.rmtree(stale)
        if not self.root.is_dir():
            self.root.mkdir(parents=True)
            fsync_dir(self.root.parent)
        try:
            partial.mkdir()
            await self._save_trainer(trainer, partial / "trainer")
            (partial / "data_source.json").write_text(json.dumps(data_state))
            meta = {"rollout_id": rollout_id, "saved_at": time.time(), **extra}
            (partial / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
            if in_flight is not None:
                (partial / "in_flight.json").write_text(json.dumps({
                    "rollout_id": in_flight.rollout_id, "metrics": in_flight.metrics,
                    "groups": [group_to_state(group) for group in in_flight.groups]}))
            fsync_tree(partial)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        retired = final.with_name(final.name + ".replaced" + PARTIAL_SUFFIX)
        if final.exists():  # the same step saved again: keep the old one until the new is in place
            os.replace(final, retired)
        os.replace(partial, final)
        fsync_dir(self.root)
        shutil.rmtree(retired, ignore_errors=True)
        for old in self.complete()[: -self.keep]:
            shutil.rmtree(old)
        fsync_dir(self.root)
        return final

    async def _save_trainer(self, trainer: Trainer, path: Path) -> None:
        """``trainer.save(path)``; an error other than an ``OSError`` (which names its file)
        becomes a :class:`CheckpointError` naming the trainer, the path and what is left."""
        try:
            await trainer.save(str(path))
        except OSError:
            raise
        except Exception as exc:
            previous = self.latest()
            left = f"the previous checkpoint {previous} is intact" if previous else "no earlier checkpoint exists"
            failure = f"{self.trainer_label} failed to save a checkpoint to {path}: {type(exc).__name__}: {exc}"
            free = _free_bytes(path.parent)
            if free is not None and free < FULL_BELOW_BYTES:  # torch and safetensors say so only obscurely
                failure = f"disk full writing {path} ({free // 1024} KiB free): {failure}"
            raise CheckpointError(f"{failure} ({left})") from exc

    async def restore(self, path: Path, trainer: Trainer, data_source: DataSource) -> dict[str, Any]:
        """Load trainer and data-source state from ``path``; returns its ``meta.json``, with the
        rollout that was in flight under ``"in_flight"`` (a :class:`RolloutBatch`) when one was saved."""
        await trainer.load(str(path / "trainer"))
        data_source.load_state_dict(json.loads((path / "data_source.json").read_text()))
        meta: dict[str, Any] = json.loads((path / "meta.json").read_text())
        if (path / "in_flight.json").is_file():
            flight = json.loads((path / "in_flight.json").read_text())
            meta["in_flight"] = RolloutBatch(flight["rollout_id"], [group_from_state(g) for g in flight["groups"]],
                                             flight["metrics"])
        return meta


def _read_meta(path: Path) -> dict[str, Any] | None:
    """``path/meta.json`` if it is there and whole, else ``None`` (not a complete checkpoint)."""
    try:
        meta = json.loads((path / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and isinstance(meta.get("rollout_id"), int) else None


def _free_bytes(path: Path) -> int | None:
    try:
        stats = os.statvfs(path)
    except (OSError, AttributeError):
        return None
    return stats.f_bavail * stats.f_frsize
