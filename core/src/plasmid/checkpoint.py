"""Atomic checkpoints of a run: trainer state, data-source state and the loop's position.

Layout under ``<run_dir>/checkpoints/``::

    step_000010/            a complete checkpoint (has meta.json)
        trainer/            written by Trainer.save (HF model, optimizer, RNG)
        data_source.json    DataSource.state_dict()
        meta.json           {"rollout_id", "weight_version", "plugin_lock", ...}
    step_000020.partial/    being written; never read, removed on the next save

A checkpoint is written under a ``.partial`` name and renamed when complete, so a crash (of a
reward plugin, an engine, the machine) during a save never leaves a directory that resume would
pick up half-written.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from plasmid.protocols import DataSource, Trainer

PARTIAL_SUFFIX = ".partial"


class Checkpoints:
    """Saves and finds the checkpoints of one run directory, keeping the newest ``keep``."""

    def __init__(self, run_dir: Path, keep: int = 2) -> None:
        self.root = Path(run_dir) / "checkpoints"
        self.keep = max(1, keep)

    def complete(self) -> list[Path]:
        """Complete checkpoints, oldest first."""
        if not self.root.is_dir():
            return []
        found = [p for p in self.root.iterdir()
                 if p.is_dir() and not p.name.endswith(PARTIAL_SUFFIX) and (p / "meta.json").is_file()]
        return sorted(found, key=lambda p: json.loads((p / "meta.json").read_text())["rollout_id"])

    def latest(self) -> Path | None:
        done = self.complete()
        return done[-1] if done else None

    async def save(self, rollout_id: int, trainer: Trainer, data_source: DataSource,
                   extra: dict[str, Any]) -> Path:
        """Write the checkpoint taken after step ``rollout_id`` and prune old ones."""
        final = self.root / f"step_{rollout_id:06d}"
        partial = final.with_name(final.name + PARTIAL_SUFFIX)
        for stale in self.root.glob(f"*{PARTIAL_SUFFIX}") if self.root.is_dir() else []:
            shutil.rmtree(stale)
        partial.mkdir(parents=True)
        await trainer.save(str(partial / "trainer"))
        (partial / "data_source.json").write_text(json.dumps(data_source.state_dict()))
        meta = {"rollout_id": rollout_id, "saved_at": time.time(), **extra}
        (partial / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
        if final.exists():
            shutil.rmtree(final)
        os.replace(partial, final)
        for old in self.complete()[: -self.keep]:
            shutil.rmtree(old)
        return final

    async def restore(self, path: Path, trainer: Trainer, data_source: DataSource) -> dict[str, Any]:
        """Load trainer and data-source state from ``path``; returns its ``meta.json``."""
        await trainer.load(str(path / "trainer"))
        data_source.load_state_dict(json.loads((path / "data_source.json").read_text()))
        meta: dict[str, Any] = json.loads((path / "meta.json").read_text())
        return meta
