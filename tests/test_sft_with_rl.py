"""SFT with RL through ``plasmid train``, the two ways of issue 21: a warm start (an RL run's
``--model`` is an SFT run's checkpoint) and SFT steps mixed with RL steps in one run
(``--loss sft-mix``), on the quickstart task (chance: eval accuracy 0.1).

Measured on 2 CPU cores (--lr 1e-3, 32 prompts x 8 samples, eval every 5 steps, seed 0):
``--loss sft`` reaches 0.31 after 60 steps; ``--loss grpo`` started from its checkpoint evaluates
at the SFT run's accuracy at its first eval (a fresh model: 0.1); ``--loss sft-mix`` (SFT and GRPO
steps alternating) reaches 0.40 after 75 steps, about 14 seconds.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from plasmid_e2e import read_metrics, run_plasmid

TARGET_ACCURACY = 0.3
CHANCE = 0.1
MAX_STEPS = 150
TRAIN_OPTIONS = ["--lr", "1e-3", "--eval-interval", "5", "--stop-at-eval-acc", str(TARGET_ACCURACY),
                 "--num-rollouts", str(MAX_STEPS)]


def evals(run_dir: Path) -> list[tuple[int, float]]:
    return [(m["step"], m["eval/accuracy"]) for m in read_metrics(run_dir) if "eval/accuracy" in m]


def latest_model(run_dir: Path) -> Path:
    """The Hugging Face model directory of ``run_dir``'s latest checkpoint (``step_N/trainer/model``)."""
    checkpoints = sorted((run_dir / "checkpoints").glob("step_*/trainer/model"))
    assert checkpoints, f"no checkpoint with a model under {run_dir / 'checkpoints'}"
    return checkpoints[-1]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_rl_run_warm_starts_from_an_sft_runs_checkpoint(tmp_path):
    sft_dir, rl_dir = tmp_path / "sft", tmp_path / "grpo"
    proc = run_plasmid("train", "--loss", "sft", "--run-dir", str(sft_dir), "--save-interval", "5", *TRAIN_OPTIONS,
                       timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sft_accuracy = evals(sft_dir)
    assert sft_accuracy[0][1] <= CHANCE + 0.05 and sft_accuracy[-1][1] >= TARGET_ACCURACY, sft_accuracy

    model = latest_model(sft_dir)
    proc = run_plasmid("train", "--loss", "grpo", "--model", str(model), "--run-dir", str(rl_dir), "--lr", "1e-3",
                       "--num-rollouts", "2", "--eval-interval", "1", "--save-interval", "0", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rl_accuracy = evals(rl_dir)
    assert rl_accuracy[0][1] >= TARGET_ACCURACY - 0.05, (
        f"the RL run from {model} should start near the SFT run's accuracy {sft_accuracy[-1]}, got {rl_accuracy}")
    assert all("train/pg_loss" in m and "train/sft_nll" not in m for m in read_metrics(rl_dir))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sft_steps_mixed_with_grpo_steps_learn_the_quickstart_task(tmp_path):
    run_dir = tmp_path / "mix"
    proc = run_plasmid("train", "--loss", "sft-mix", "--sft-mix-loss", "grpo", "--sft-mix-every", "2",
                       "--run-dir", str(run_dir), "--save-interval", "20", *TRAIN_OPTIONS, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    accuracy = evals(run_dir)
    assert accuracy[0][1] <= CHANCE + 0.05, f"the untrained model should be near chance, got {accuracy[0]}"
    assert accuracy[-1][1] >= TARGET_ACCURACY, f"--loss sft-mix did not reach {TARGET_ACCURACY}: {accuracy}"
    steps = [m for m in read_metrics(run_dir) if "train/sft_step" in m]
    sft = [m["step"] for m in steps if m["train/sft_step"] == 1.0]
    rl = [m["step"] for m in steps if m["train/sft_step"] == 0.0]
    assert sft == [step for step in range(len(steps)) if step % 2 == 1] and len(rl) + len(sft) == len(steps)
    assert all(m["train/sft_nll"] > 0 for m in steps if m["step"] in sft)
    assert all("train/pg_loss" in m and "train/mismatch_kl" in m for m in steps if m["step"] in rl)
    assert sorted((run_dir / "checkpoints").rglob("trainer_state.pt")), "no trainer checkpoint"
