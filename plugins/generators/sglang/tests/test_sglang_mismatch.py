"""The train/rollout mismatch metrics of an on-policy ``plasmid train --engine sglang`` run (a
subprocess that launches its own SGLang server; the options of ``test_sglang_train.py``).

On-policy with one optimizer update per step, the first micro-batch's policy log-probs are the
old ones the trainer computed before the update, so ``train/ppo_kl`` is exactly 0 (slime's CI
check). The engine's log-probs differ from the trainer's only by float32 operation order (plasmid
serves the float32 checkpoint in float32): bound :data:`LOGPROB_BOUND`, as in
``test_sglang_train.py`` (measured there under 2e-7).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from sglang_test_support import server_env, sglang_installed

LOGPROB_BOUND = 1e-5


@pytest.mark.skipif(not sglang_installed(), reason="SGLang is not installed")
@pytest.mark.timeout(600)
def test_an_on_policy_sglang_step_has_zero_ppo_kl_and_matching_logprobs(tmp_path):
    run_dir = tmp_path / "run"
    env_options = [option for entry in server_env() for option in ("--sglang-server-env", entry)]
    command = [sys.executable, "-m", "plasmid.cli", "train", "--engine", "sglang", "--task", "digitsum",
               "--task-length", "1", "--task-eval-size", "2", "--prompts-per-step", "8", "--num-rollouts", "2",
               "--eval-interval", "0", "--save-interval", "0", "--run-dir", str(run_dir),
               "--sglang-skip-tokenizer-init", "false", "--sglang-health-interval", "5", *env_options]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=540)
    assert proc.returncode == 0, proc.stderr[-4000:]
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert len(metrics) == 2 and metrics[-1]["weight_version"] == 2
    for m in metrics:
        assert m["train/ppo_kl"] == 0.0, f"step {m['step']}: first micro-batch ppo_kl {m['train/ppo_kl']!r}"
        assert m["train/logprob_abs_diff_mean"] <= LOGPROB_BOUND, (
            f"step {m['step']}: engine and trainer log-probs {m['train/logprob_abs_diff_mean']:.2e} apart")
        assert m["train/mismatch_kl"] <= LOGPROB_BOUND
        assert m["train/token_prob_ratio_max"] == pytest.approx(1.0, abs=1e-4)
    print("logprob_abs_diff_mean", [m["train/logprob_abs_diff_mean"] for m in metrics])
