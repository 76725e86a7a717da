"""Every RL algorithm (loss provider) learns the quickstart task through ``plasmid train``.

The quickstart task (mod10: ``a+b=`` -> ``(a + b) % 10``, 100 prompts) with its tiny model
starts at chance, eval accuracy 0.1. Each provider trains until its greedy eval accuracy reaches
:data:`TARGET_ACCURACY` (three times chance) and must get there within :data:`MAX_STEPS` steps.

Measured on 2 CPU cores (--lr 1e-3, 32 prompts x 8 samples, eval every 5 steps, seed 0): every
provider reaches 0.3 after 95 to 160 steps (seed 1: 140 to 165), about 180 CPU-seconds for all
nine. The runs are subprocesses, two at a time (each uses one core), all started by the first
test that needs them; the runs are deterministic for a given machine and torch build.
"""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from plasmid_e2e import read_metrics, run_plasmid

PROVIDERS = ("grpo", "dr-grpo", "dapo", "gspo", "cispo", "rloo", "ppo", "reinforce++", "reinforce++-baseline")
TARGET_ACCURACY = 0.3
MAX_STEPS = 300
CHANCE = 0.1
TRAIN_OPTIONS = ["--lr", "1e-3", "--eval-interval", "5", "--stop-at-eval-acc", str(TARGET_ACCURACY),
                 "--num-rollouts", str(MAX_STEPS), "--save-interval", "0"]
#: metrics every loss reports (``train/`` prefix), and those of PPO's critic
LOSS_METRICS = ("pg_loss", "clip_frac", "approx_kl", "entropy", "advantage_mean", "advantage_std",
                "mismatch_abs_diff", "mismatch_kl", "mismatch_ratio_mean")
CRITIC_METRICS = ("value_loss", "value_clip_frac", "explained_variance", "value_mean", "critic_grad_norm")


def train(loss: str, run_dir: Path) -> subprocess.CompletedProcess:
    return run_plasmid("train", "--loss", loss, "--run-dir", str(run_dir), *TRAIN_OPTIONS, timeout=900)


@pytest.fixture(scope="module")
def learning_runs(request, tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """``{loss: (process, run_dir)}`` for the providers of the selected tests, two runs at a time."""
    wanted = [item.callspec.params["loss"] for item in request.session.items
              if getattr(item, "originalname", "") == "test_loss_learns_the_quickstart_task"]
    root = tmp_path_factory.mktemp("learn")
    dirs = {loss: root / loss.replace("+", "p") for loss in wanted}
    with ThreadPoolExecutor(max_workers=2) as pool:
        processes = dict(zip(wanted, pool.map(lambda loss: train(loss, dirs[loss]), wanted), strict=True))
    return {loss: (processes[loss], dirs[loss]) for loss in wanted}


@pytest.mark.slow
@pytest.mark.parametrize("loss", PROVIDERS)
def test_loss_learns_the_quickstart_task(loss, learning_runs):
    proc, run_dir = learning_runs[loss]
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = read_metrics(run_dir)
    accuracy = [(m["step"], m["eval/accuracy"]) for m in metrics if "eval/accuracy" in m]
    assert accuracy[0][1] <= CHANCE + 0.05, f"the untrained model should be near chance, got {accuracy[0]}"
    assert accuracy[-1][1] >= TARGET_ACCURACY, (
        f"--loss {loss} did not reach eval accuracy {TARGET_ACCURACY} in {MAX_STEPS} steps: {accuracy}")
    expected = LOSS_METRICS + (CRITIC_METRICS if loss == "ppo" else ())
    missing = [name for name in expected if f"train/{name}" not in metrics[-1]]
    assert not missing, f"--loss {loss} does not report {missing}"
    print(f"{loss}: eval accuracy {accuracy[-1][1]:.2f} after {len(metrics)} steps")
