"""A reward plugin that raises, in a real run: counted in the metrics and named (with its plugin)
while the run goes on; with ``--reward-errors fail`` the run stops with exit 2 naming the plugin,
and the checkpoint written before the failure is complete and resumes."""

from __future__ import annotations

import json

import pytest
from plasmid_e2e import SHORT_RUN, read_metrics, run_plasmid

EMBEDDED = "hf,tasks,torchgen,rollout,torchtrain,grpo,sync,match"

#: Raises "verifier crashed" once it has scored FLAKY_OK_CALLS samples (env; default 0: always).
FLAKY = '''
import os
from plasmid import hookimpl


class Flaky:
    def __init__(self, config):
        self.calls = 0

    async def __call__(self, sample):
        self.calls += 1
        if self.calls > int(os.environ.get("FLAKY_OK_CALLS", "0")):
            raise RuntimeError("verifier crashed")
        return 1.0


@hookimpl
def plasmid_rewards(register):
    register("flaky", Flaky)
'''

#: 4 prompts x 4 samples per step in SHORT_RUN.
SAMPLES_PER_STEP = 16


@pytest.fixture
def flaky_plugin(tmp_path):
    path = tmp_path / "flaky_verifier.py"
    path.write_text(FLAKY)
    return path


def train(plugin, run_dir, *args, ok_calls=0):
    return run_plasmid("train", "--plugins", f"{EMBEDDED},{plugin}", "--reward", "exact", "--reward", "flaky:0.5",
                       *SHORT_RUN, "--run-dir", str(run_dir), *args, env={"FLAKY_OK_CALLS": str(ok_calls)})


def complete_checkpoints(run_dir):
    root = run_dir / "checkpoints"
    assert not list(root.glob("*.partial")), "a half-written checkpoint was left behind"
    return sorted(json.loads((path / "meta.json").read_text())["rollout_id"] for path in root.iterdir())


def test_a_raising_reward_is_counted_and_named_and_the_run_goes_on(tmp_path, flaky_plugin):
    run_dir = tmp_path / "run"
    proc = train(flaky_plugin, run_dir, "--eval-interval", "0", "--save-interval", "1")
    assert proc.returncode == 0, proc.stderr
    metrics = read_metrics(run_dir)
    assert len(metrics) == 2
    for step in metrics:
        assert step["reward/failed/flaky: RuntimeError"] == SAMPLES_PER_STEP
        assert step["rollout/reward/flaky"] == 0.0 and "rollout/reward/exact" in step
    assert "reward 'flaky' from plugin 'flaky_verifier' (local module" in proc.stderr
    assert "RuntimeError: verifier crashed" in proc.stderr
    assert complete_checkpoints(run_dir) == [0, 1]


def test_with_reward_errors_fail_the_run_stops_naming_the_plugin_and_resumes_from_its_checkpoint(
        tmp_path, flaky_plugin):
    run_dir = tmp_path / "run"
    stopping = train(flaky_plugin, run_dir, "--eval-interval", "0", "--save-interval", "1",
                     "--reward-errors", "fail", ok_calls=SAMPLES_PER_STEP)
    assert stopping.returncode == 2, stopping.stderr
    assert "plasmid: error: reward 'flaky' from plugin 'flaky_verifier' (local module" in stopping.stderr
    assert "RuntimeError: verifier crashed" in stopping.stderr
    assert "Traceback" not in stopping.stderr
    assert complete_checkpoints(run_dir) == [0]  # step 0 was saved before step 1 failed, and is whole
    assert len(read_metrics(run_dir)) == 1

    resumed = train(flaky_plugin, run_dir, "--eval-interval", "0", "--save-interval", "1", "--resume",
                    "--reward-errors", "fail", ok_calls=10**6)
    assert resumed.returncode == 0, resumed.stderr
    steps = [entry.get("step", entry.get("rollout_id")) for entry in read_metrics(run_dir)]
    assert steps[-1] == 1 and len(steps) == 2
    assert complete_checkpoints(run_dir) == [0, 1]


#: Blocks its event loop (time.sleep inside async def) for an hour on every call.
HANG = '''
import time
from plasmid import hookimpl


class Hang:
    def __init__(self, config):
        pass

    async def __call__(self, sample):
        time.sleep(3600)
        return 1.0


@hookimpl
def plasmid_rewards(register):
    register("hang", Hang)
'''


@pytest.mark.timeout(600)
def test_a_reward_that_blocks_its_event_loop_times_out_and_the_run_goes_on(tmp_path):
    plugin = tmp_path / "hanging_verifier.py"
    plugin.write_text(HANG)
    run_dir = tmp_path / "run"
    proc = run_plasmid("train", "--plugins", f"{EMBEDDED},{plugin}", "--reward", "exact", "--reward", "hang:0.5",
                       *SHORT_RUN, "--eval-interval", "0", "--reward-timeout", "1", "--run-dir", str(run_dir),
                       timeout=300)
    assert proc.returncode == 0, proc.stderr
    metrics = read_metrics(run_dir)
    assert len(metrics) == 2
    for step in metrics:
        assert step["reward/failed/hang: timeout"] == SAMPLES_PER_STEP
        assert step["rollout/reward/hang"] == 0.0 and "rollout/reward/exact" in step
    assert sum(step.get("reward/workers_abandoned", 0) for step in metrics) >= 1
    assert "reward 'hang' from plugin 'hanging_verifier' (local module" in proc.stderr
    assert "timed out after 1s (--reward-timeout)" in proc.stderr


@pytest.mark.timeout(600)
def test_a_run_whose_every_reward_fails_warns_each_step_and_stops_after_three(tmp_path, flaky_plugin):
    run_dir = tmp_path / "run"
    proc = run_plasmid("train", "--plugins", f"{EMBEDDED},{flaky_plugin}", "--reward", "flaky", *SHORT_RUN,
                       "--num-rollouts", "5", "--eval-interval", "0", "--run-dir", str(run_dir),
                       env={"FLAKY_OK_CALLS": "0"})
    assert proc.returncode == 2, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("plasmid: warning: every reward failed")]
    assert len(warnings) == 2, proc.stderr
    assert f"on all {SAMPLES_PER_STEP} samples scored (reward 'flaky' from plugin 'flaky_verifier'" in warnings[0]
    assert "first failure: reward 'flaky' from plugin 'flaky_verifier'" in warnings[0]
    assert "RuntimeError: verifier crashed" in warnings[0]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("plasmid: error:")]
    assert len(errors) == 1 and "stopping after 3 such steps in a row" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(read_metrics(run_dir)) == 2
