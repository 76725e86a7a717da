"""``plasmid train --engine vllm`` end to end, in a subprocess that launches its own vLLM server.

The task is the quickstart's ``digitsum`` with one digit (``7=`` -> ``7``), learnt in tens of steps
at ``--lr 2e-3`` (as in the SGLang engine's end-to-end test). The quickstart's tiny model has 4
attention heads of size 16, for which vLLM's CPU attention has no kernel, so the test puts a model
of the same shape with one head of size 64 at ``<run dir>/model`` first (the recipe keeps a model
that is already there) and serves it with ``--vllm-max-model-len 64`` (its positions).

The engine's log-probs must match the trainer's: both compute in float32 (plasmid serves a
float32 checkpoint in float32), so the difference is the order of float32 operations (oneDNN
GEMMs in vLLM, eager attention in transformers); the bound is 1e-4.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest
from vllm_test_support import vllm_installed

LOGPROB_BOUND = 1e-4


@pytest.mark.timeout(1200)
@pytest.mark.skipif(not vllm_installed(), reason="vLLM is not installed")
def test_a_short_quickstart_run_on_vllm_learns_and_its_logprobs_match_the_trainers(tmp_path):
    from plasmid_torch.tiny import build_tiny_model

    run_dir = tmp_path / "run"
    build_tiny_model(run_dir / "model", seed=0, num_heads=1, max_positions=64)
    server_env = ["OMP_NUM_THREADS=1", "VLLM_CPU_OMP_THREADS_BIND=nobind", "VLLM_ENABLE_V1_MULTIPROCESSING=0"]
    env_options = [option for entry in server_env for option in ("--vllm-server-env", entry)]
    command = [sys.executable, "-m", "plasmid.app.cli", "train", "--engine", "vllm", "--task", "digitsum",
               "--task-length", "1", "--task-eval-size", "2", "--lr", "2e-3", "--prompts-per-step", "16",
               "--num-rollouts", "40", "--eval-interval", "0", "--save-interval", "0", "--run-dir", str(run_dir),
               "--vllm-max-model-len", "64", "--vllm-enforce-eager", "--vllm-distributed-executor-backend", "uni",
               "--vllm-health-interval", "5", "--vllm-startup-timeout", "900", *env_options]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1150)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "engine=vllm" in proc.stderr
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert len(metrics) == 40 and all(m["weight_version"] == m["step"] + 1 for m in metrics)
    rewards = [m["rollout/reward_mean"] for m in metrics]
    first, last = statistics.mean(rewards[:5]), statistics.mean(rewards[-5:])
    assert first < 0.3, f"the untrained model should be near chance (0.1), got {first:.2f}"
    assert last > first + 0.3, f"reward did not rise: first 5 steps {first:.2f}, last 5 steps {last:.2f}"
    diffs = [m["train/train_rollout_logprob_abs_diff"] for m in metrics]
    assert max(diffs) <= LOGPROB_BOUND, f"engine and trainer log-probs disagree: max {max(diffs):.2e}"
    assert "--model" in (run_dir / "vllm" / "server-0.log").read_text(), "the server's log is in <run dir>/vllm"
