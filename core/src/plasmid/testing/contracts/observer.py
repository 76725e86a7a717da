"""The contract every observer plugin (``plasmid_run_start`` / ``plasmid_metrics`` /
``plasmid_step_end`` / ``plasmid_weights_synced`` / ``plasmid_run_end`` implementations) must meet.

Observers register no provider, so the subclass names only the plugin module and the options
that turn it on::

    from plasmid.testing.contracts.observer import ObserverContract

    class TestMyTracker(ObserverContract):
        plugin = my_tracker.plugin
        config_options = {"my_tracker": True}

The hooks are called through a plugin manager (so their signatures are checked against
:mod:`plasmid.hookspecs`) in the order a run calls them, with a run directory under pytest's
``tmp_path``. What it checks: a whole run (metrics with NaN, infinity, ints, bools and an empty
step; step ends; a weight sync) raises nothing; a run that ends with an error and two runs in a
row in one process do neither; ``plasmid_run_end`` (and metrics) without a start, as when another
observer's start failed, are ignored; nothing is written outside the run directory. Imports no
torch.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from plasmid.testing import make_config, make_manager
from plasmid.types import SyncReport

#: A step's metrics with the values an observer must tolerate.
AWKWARD_METRICS: dict[str, Any] = {"rollout/reward_mean": 0.5, "train/loss": float("nan"),
                                   "train/grad_norm": float("inf"), "rollout/samples": 8, "train/flag": True}


class ObserverContract:
    """Checks of an observer plugin; see the module docstring for how to use it."""

    plugin: Any = None
    #: option values (Python names) that turn the observer on, on top of the defaults.
    config_options: dict[str, Any] = {}

    def hooks(self) -> Any:
        return make_manager(self.plugin).pm.hook

    def whole_run(self, run_dir: Path, error: str | None = None) -> None:
        hook = self.hooks()
        config = make_config(self.plugin, run_dir=run_dir, **self.config_options)
        hook.plasmid_run_start(config=config, run_dir=str(run_dir))
        for step, metrics in enumerate([AWKWARD_METRICS, {}, {"rollout/reward_mean": 1.0}]):
            hook.plasmid_metrics(step=step, metrics=dict(metrics))
            hook.plasmid_weights_synced(step=step, report=SyncReport(bytes=10, seconds=0.1, weight_version=step + 1,
                                                                     buckets=1))
            hook.plasmid_step_end(step=step, run_dir=str(run_dir), metrics=dict(metrics))
        hook.plasmid_run_end(run_dir=str(run_dir), metrics={"rollout/reward_mean": 1.0}, error=error)

    def test_a_whole_run_raises_nothing(self, tmp_path: Path) -> None:
        self.whole_run(tmp_path / "run")

    def test_a_failed_run_ends_quietly(self, tmp_path: Path) -> None:
        self.whole_run(tmp_path / "run", error="RuntimeError: the trainer failed")

    def test_two_runs_in_a_row_in_one_process(self, tmp_path: Path) -> None:
        self.whole_run(tmp_path / "first")
        self.whole_run(tmp_path / "second")

    def test_an_end_without_a_start_is_ignored(self, tmp_path: Path) -> None:
        hook = self.hooks()
        hook.plasmid_metrics(step=0, metrics={"rollout/reward_mean": 0.5})
        hook.plasmid_run_end(run_dir=str(tmp_path / "run"), metrics={}, error="UsageError: start-up failed")

    def test_nothing_is_written_outside_the_run_directory(self, tmp_path: Path, monkeypatch: Any) -> None:
        outside = tmp_path / "cwd"
        outside.mkdir()
        monkeypatch.chdir(outside)
        self.whole_run(tmp_path / "run")
        assert not any(os.scandir(outside)), f"written outside the run directory: {os.listdir(outside)}"


__all__ = ["AWKWARD_METRICS", "ObserverContract"]
