"""A run killed before its first checkpoint is not a dead end: ``plasmid train --resume`` (what a
scheduler restarts with) starts it again from step 0, saying so in one line."""

from __future__ import annotations

import shutil

import pytest
from plasmid_e2e import read_metrics, run_plasmid

TINY = ["--prompts-per-step", "4", "--n-samples-per-prompt", "4", "--eval-interval", "0", "--save-interval", "1000"]


@pytest.mark.timeout(300)
def test_resume_of_a_run_killed_before_its_first_checkpoint_starts_it_from_step_0(tmp_path):
    run_dir = tmp_path / "run"
    first = run_plasmid("train", *TINY, "--num-rollouts", "2", "--run-dir", str(run_dir))
    assert first.returncode == 0, first.stderr
    shutil.rmtree(run_dir / "checkpoints")  # as a run killed before it wrote one leaves it: header, metrics
    (run_dir / "checkpoints" / "step_000001.partial").mkdir(parents=True)
    resumed = run_plasmid("train", *TINY, "--num-rollouts", "2", "--run-dir", str(run_dir), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    said = [line for line in resumed.stderr.splitlines() if "holds no complete checkpoint" in line]
    assert said == [f"plasmid: --resume: {run_dir} holds no complete checkpoint (nothing under "
                    f"{run_dir / 'checkpoints'}); starting the run from step 0"]
    assert [entry["step"] for entry in read_metrics(run_dir)] == [0, 1]
    assert (run_dir / "checkpoints" / "step_000001").is_dir()

    again = run_plasmid("train", *TINY, "--num-rollouts", "2", "--temperature", "0.5", "--run-dir", str(run_dir),
                        "--resume")
    assert again.returncode == 2 and "this run differs" in again.stderr and "Traceback" not in again.stderr
