"""Cheap checks of benchmarks/bench_scaling.py: the steady-state arithmetic on made-up metrics and
the tables, failed points included. Nothing is timed and no benchmark runs here."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_scaling.py"


@pytest.fixture(scope="module")
def scaling():
    spec = importlib.util.spec_from_file_location("bench_scaling", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def row(step_seconds: float) -> dict:
    return {"time/step_seconds": step_seconds, "time/rollout_seconds": step_seconds / 2,
            "time/train_seconds": step_seconds / 4, "time/overhead_seconds": 0.001, "train/samples": 32.0,
            "rollout/response_length_mean": 2.0}


def test_steady_state_leaves_the_warm_up_steps_out(scaling):
    point = scaling.steady_state([row(5.0), row(3.0), row(0.1), row(0.2), row(0.1)], warmup=2)
    assert point["steps"] == 5 and point["step_ms"] == pytest.approx(100.0)
    assert point["rollout_ms"] == pytest.approx(50.0) and point["sync_ms"] == 0.0
    assert point["overhead_ms"] == pytest.approx(1.0)
    assert point["samples_per_second"] == pytest.approx(320.0)


def test_tables_show_every_point_and_sync_failed_ones_included(scaling, capsys):
    good = {"name": "batch8", "peak_rss_mb": 400.0, **scaling.steady_state([row(0.1)], warmup=0)}
    scaling.print_tables({"curves": {"batch": [good, {"name": "batch16", "error": "exit 2: boom"}]},
                          "sync": {"parameters": 101e6, "megabytes": 385.0, "engines": 1, "repeats": 1,
                                   "rows": [{"sync": "in-process copy (baseline)", "mb_per_second": 900.0,
                                             "x_baseline": 1.0},
                                            {"sync": "local  disk", "mb_per_second": 90.0, "x_baseline": 0.1}]}})
    out = capsys.readouterr().out
    assert "batch8" in out and "100.0" in out and "batch16      FAILED" in out
    assert "101.0M parameters" in out and "local  disk" in out and "0.100" in out
