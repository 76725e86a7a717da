"""``--profile`` in the torch trainer (forward/backward and optimizer seconds of each update) and
``--profile-step`` (a chrome trace of one step, :mod:`plasmid_torchtrain.profiling`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch
from plasmid_torchtrain import profiling

from plasmid import testing
from plasmid.kernel_options import ProfileOptions
from plasmid_torch.training import timed_update, update_metrics

PARTS = ("time/rollout_seconds", "time/train_seconds", "time/sync_wall_seconds", "time/eval_seconds",
         "time/checkpoint_seconds", "time/overhead_seconds")


def test_timed_update_splits_the_forward_backward_passes_from_the_optimizer_step():
    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([weight], lr=0.1)

    def micro_losses():
        for _ in range(2):
            time.sleep(0.02)
            yield (weight * 2).sum(), {"loss": 1.0}

    def update(losses):
        for loss, _ in losses:
            loss.backward()
        time.sleep(0.03)
        optimizer.step()
        return {"loss": 2.0}

    metrics = timed_update(update, micro_losses(), torch.device("cpu"), prefix="critic_")
    assert metrics["loss"] == 2.0
    assert metrics["critic_forward_backward_seconds"] >= 0.04
    assert metrics["critic_optimizer_seconds"] >= 0.03
    assert torch.equal(weight.grad, torch.full((3,), 4.0))


def test_update_times_are_summed_over_the_updates_of_a_step():
    merged = update_metrics([{"loss": 1.0, "forward_backward_seconds": 0.5, "optimizer_seconds": 0.1},
                             {"loss": 3.0, "forward_backward_seconds": 0.25, "optimizer_seconds": 0.1}])
    assert merged["train/loss"] == 2.0
    assert merged["train/forward_backward_seconds"] == 0.75 and merged["train/optimizer_seconds"] == 0.2


def test_a_step_zero_trace_starts_with_the_run_and_a_run_ending_early_writes_none(tmp_path):
    config = testing.make_config(run_dir=tmp_path, profile_step=0)
    assert ProfileOptions.of(config).profile_step == 0
    profiling.run_start(config, str(tmp_path))
    torch.mm(torch.ones(4, 4), torch.ones(4, 4))
    profiling.step_end(0, str(tmp_path))
    trace = json.loads(profiling.trace_path(tmp_path, 0).read_text())
    assert trace["traceEvents"]

    config = testing.make_config(run_dir=tmp_path / "other", profile_step=2)
    profiling.run_start(config, str(tmp_path / "other"))
    profiling.step_end(0, str(tmp_path / "other"))
    profiling.step_end(1, str(tmp_path / "other"))     # started here
    profiling.run_end(str(tmp_path / "other"))          # the run stopped in step 2
    assert not (tmp_path / "other" / "profile").exists()


@pytest.mark.timeout(300)
def test_quickstart_with_profile_writes_the_breakdown_and_a_chrome_trace_of_the_chosen_step(tmp_path):
    run_dir = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "plasmid.app.cli", "train", "--num-rollouts", "2", "--prompts-per-step", "4",
         "--n-samples-per-prompt", "4", "--eval-interval", "1", "--save-interval", "1", "--profile",
         "--profile-step", "1", "--run-dir", str(run_dir)],
        capture_output=True, text=True, env=env, timeout=280)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "no trace was written" not in result.stderr
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        assert sum(row[name] for name in PARTS) == pytest.approx(row["time/step_seconds"], abs=1e-6)
        assert row["time/reward_seconds"] > 0
        assert 0 < row["train/forward_backward_seconds"] + row["train/optimizer_seconds"] <= row["train/seconds"]
    assert rows[1]["time/checkpoint_seconds"] > 0
    assert rows[1]["time/eval_seconds"] > 0
    assert sorted(p.name for p in (run_dir / "profile").iterdir()) == ["step_1.trace.json"]
    events = json.loads((run_dir / "profile" / "step_1.trace.json").read_text())["traceEvents"]
    names = {event.get("name") for event in events}
    assert "aten::mm" in names or "aten::addmm" in names, "the compute thread's ops are not in the trace"


def test_a_profile_step_the_run_never_reaches_is_warned_about(tmp_path, capsys):
    from plasmid.app.run import warn_missing_trace

    config = testing.make_config(run_dir=tmp_path, profile_step=4)
    warn_missing_trace(config)
    err = capsys.readouterr().err
    assert err.startswith("plasmid: warning: --profile-step 4: no trace was written") and err.count("\n") == 1
    profiling.trace_path(tmp_path, 4).parent.mkdir()
    profiling.trace_path(tmp_path, 4).write_text("{}")
    warn_missing_trace(config)
    assert capsys.readouterr().err == ""
