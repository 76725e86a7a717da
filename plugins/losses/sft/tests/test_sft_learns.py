"""--loss sft learns the quickstart task through plasmid train, in tests/test_algorithms_learn.py's
style: from chance (eval accuracy 0.1) to 0.3, the same trainer and checkpoints as the RL losses.

Measured on 2 CPU cores (the quickstart recipe, --lr 1e-3, 32 prompts x 8 samples, eval every 5
steps, seed 0): 0.31 after 60 steps, about 20 CPU-seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

TARGET_ACCURACY = 0.3
MAX_STEPS = 150


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sft_learns_the_quickstart_task(tmp_path):
    run_dir = tmp_path / "sft"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "plasmid.app.cli", "train", "--loss", "sft", "--lr", "1e-3",
                           "--eval-interval", "5", "--stop-at-eval-acc", str(TARGET_ACCURACY),
                           "--num-rollouts", str(MAX_STEPS), "--save-interval", "20", "--run-dir", str(run_dir)],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    accuracy = [(m["step"], m["eval/accuracy"]) for m in metrics if "eval/accuracy" in m]
    assert accuracy[0][1] <= 0.15, f"the untrained model should be near chance, got {accuracy[0]}"
    assert accuracy[-1][1] >= TARGET_ACCURACY, f"--loss sft did not reach {TARGET_ACCURACY}: {accuracy}"
    assert all(m["train/sft_nll"] > 0 and m["train/ppo_kl"] == 0.0 for m in metrics)
    assert metrics[-1]["train/sft_nll"] < metrics[0]["train/sft_nll"]
    saved = sorted((run_dir / "checkpoints").rglob("trainer_state.pt"))
    assert saved, f"no trainer checkpoint: {sorted(p.name for p in (run_dir / 'checkpoints').iterdir())}"
