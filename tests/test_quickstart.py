"""The embedded default end to end: it learns, its log-probs agree, it resumes exactly."""

from __future__ import annotations

import statistics

import pytest
from plasmid_e2e import SHORT_RUN, read_metrics, run_plasmid

DETERMINISTIC_KEYS = ("rollout/reward_mean", "rollout/response_length_mean", "train/loss", "train/grad_norm",
                      "eval/accuracy", "rollout/groups_aborted", "rollout/staleness_mean")


@pytest.mark.slow
def test_quickstart_reward_rises_and_logprobs_match(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_plasmid("train", "--num-rollouts", "150", "--eval-interval", "75", "--save-interval", "0",
                       "--run-dir", str(run_dir), timeout=600)
    assert proc.returncode == 0, proc.stderr
    metrics = read_metrics(run_dir)
    assert len(metrics) == 150
    rewards = [m["rollout/reward_mean"] for m in metrics]
    first, last = statistics.mean(rewards[:10]), statistics.mean(rewards[-10:])
    assert first < 0.25, f"the untrained model should be near chance (0.1), got {first:.2f}"
    assert last > first + 0.2, f"reward did not rise: first 10 steps {first:.2f}, last 10 steps {last:.2f}"
    diffs = [m["train/train_rollout_logprob_abs_diff"] for m in metrics]
    assert max(diffs) <= 1e-4, f"engine and trainer log-probs disagree after sync: max {max(diffs):.2e}"
    assert (run_dir / "reward_curve.svg").stat().st_size > 1000
    assert (run_dir / "config.json").is_file() and (run_dir / "plugins.lock.json").is_file()


KILL_AT_STEP = '''
import os
from plasmid import hookimpl


@hookimpl
def plasmid_step_end(step, run_dir, metrics):
    if step == {step}:
        os._exit(17)  # a hard kill: no cleanup, no final checkpoint
'''


def test_killed_and_resumed_run_matches_an_uninterrupted_one(tmp_path):
    options = [*SHORT_RUN, "--num-rollouts", "6", "--save-interval", "3", "--eval-interval", "2"]
    straight = tmp_path / "straight"
    proc = run_plasmid("train", *options, "--run-dir", str(straight))
    assert proc.returncode == 0, proc.stderr

    killer = tmp_path / "killer.py"
    killer.write_text(KILL_AT_STEP.format(step=4))
    interrupted = tmp_path / "interrupted"
    proc = run_plasmid("train", *options, "--run-dir", str(interrupted), "--plugins", str(killer))
    assert proc.returncode == 17, proc.stderr
    assert len(read_metrics(interrupted)) == 5  # steps 0..4 logged; the last checkpoint is after step 2
    proc = run_plasmid("train", *options, "--run-dir", str(interrupted), "--resume", "--resume-allow-changes")
    assert proc.returncode == 0, proc.stderr

    expected, resumed = read_metrics(straight), read_metrics(interrupted)
    assert [m["step"] for m in resumed] == list(range(6))
    for want, got in zip(expected, resumed, strict=True):
        for key in DETERMINISTIC_KEYS:
            if key in want:
                assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), (want["step"], key)


#: --schedule async overlapping rollout k+1 with step k, --partial-rollout giving back groups cut
#: mid-response (over-sampled, longer responses at a high temperature so that some are cut)
ASYNC_PARTIAL = ["--schedule", "async", "--placement", "disaggregate", "--partial-rollout", "--over-sampling", "2",
                 "--max-new-tokens", "24", "--temperature", "1.5"]


@pytest.mark.parametrize("kill_at", [3, 4])
def test_a_killed_async_partial_run_resumes_on_the_rollout_it_had_in_flight(tmp_path, kill_at):
    """With over-sampling, which groups a step keeps and where a cut group stops depend on when the
    engine's thread and the event loop meet, so two uninterrupted async runs can differ (on a loaded
    machine they agreed, on an idle one they did not). What a resume must reproduce is the interrupted
    run itself: the checkpoint of step 2 holds rollout 3, finished, and the data position after it,
    so the resumed step 3 is the interrupted run's step 3 exactly (same samples, same trainer state);
    generating rollout 3 again, with step 2's newer weights, gave other lengths and staleness."""
    options = [*SHORT_RUN, "--num-rollouts", "6", "--save-interval", "3", "--eval-interval", "2", *ASYNC_PARTIAL]
    killer = tmp_path / "killer.py"
    killer.write_text(KILL_AT_STEP.format(step=kill_at))
    run_dir = tmp_path / "run"
    proc = run_plasmid("train", *options, "--run-dir", str(run_dir), "--plugins", str(killer))
    assert proc.returncode == 17, proc.stderr
    before = read_metrics(run_dir)
    assert [m["step"] for m in before] == list(range(kill_at + 1))
    assert (run_dir / "checkpoints" / "step_000002" / "in_flight.json").is_file()
    proc = run_plasmid("train", *options, "--run-dir", str(run_dir), "--resume", "--resume-allow-changes")
    assert proc.returncode == 0, proc.stderr

    resumed = read_metrics(run_dir)
    assert [m["step"] for m in resumed] == list(range(6))
    assert sum(m["rollout/groups_aborted"] for m in before + resumed) > 0, "no group was cut: partial rollout untested"
    for want, got in zip(before[:4], resumed[:4], strict=True):       # the checkpoint's steps, then step 3
        for key in DETERMINISTIC_KEYS:
            if key in want:
                assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), (want["step"], key)


def test_any_local_model_directory_trains_llama_style(tmp_path):
    from plasmid_torch.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "llama", arch="llama", seed=3)
    run_dir = tmp_path / "run"
    proc = run_plasmid("train", "--model", str(model), *SHORT_RUN, "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stderr
    checkpoint = run_dir / "checkpoints" / "step_000001" / "trainer" / "model"
    assert "LlamaForCausalLM" in (checkpoint / "config.json").read_text()
    assert max(m["train/train_rollout_logprob_abs_diff"] for m in read_metrics(run_dir)) <= 1e-4
