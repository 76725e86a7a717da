"""``plasmid rollout``: generates and scores without training, saving what ``--save-rollouts`` asks."""

from __future__ import annotations

import json

import pytest
from plasmid_e2e import read_metrics, run_plasmid

from plasmid.app.rollout_store import RolloutStore

SMALL = ["--seed", "2", "--num-rollouts", "2", "--prompts-per-step", "3", "--n-samples-per-prompt", "2"]


@pytest.mark.timeout(600)
def test_rollout_generates_and_scores_without_training(tmp_path):
    run, saved = tmp_path / "run", tmp_path / "saved"
    (tmp_path / "afile").write_text("x")
    refused = run_plasmid("rollout", *SMALL, "--run-dir", str(run), "--save-rollouts", str(tmp_path / "afile"))
    assert refused.returncode == 2 and "is a file, not a directory" in refused.stderr
    assert refused.stderr.count("\n") == 1 and not run.exists()

    done = run_plasmid("rollout", *SMALL, "--run-dir", str(run), "--save-rollouts", str(saved))
    assert done.returncode == 0, done.stderr[-2000:]
    rows = read_metrics(run)
    assert [row["step"] for row in rows] == [0, 1]
    assert all("rollout/reward_mean" in row and not any(k.startswith("train/") for k in row) for row in rows)
    assert json.loads(done.stdout.splitlines()[-1])["step"] == 1
    assert not (run / "checkpoints").exists()
    store = RolloutStore(saved)
    assert store.steps() == [0, 1]
    batch = store.load(1)
    assert len(batch.groups) == 3 and all(len(g.samples) == 2 for g in batch.groups)
    sample = batch.groups[0].samples[0]
    assert sample.response_length > 0 and len(sample.rollout_logprobs) == sample.response_length
    assert sample.reward is not None and batch.metrics["rollout/reward_mean"] == rows[1]["rollout/reward_mean"]


@pytest.mark.parametrize(("command", "shown"), [("rollout", "--save-rollouts"), ("replay", "plasmid replay DIR"),
                                                ("eval", "--eval-n-samples")])
def test_each_command_answers_help(command, shown):
    answered = run_plasmid(command, "--help")
    assert answered.returncode == 0 and shown in answered.stdout, answered.stderr[-1000:]
