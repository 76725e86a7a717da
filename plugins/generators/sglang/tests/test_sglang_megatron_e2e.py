"""``plasmid train --trainer megatron --engine sglang`` end to end on the CPU: one environment holds
megatron-core and SGLang (the sglang tox env, ``requirements/sglang.txt``), a launched SGLang server
serves the quickstart model, and every step ends with a ``sglang-tensor`` sync (flattened buckets
through ``/update_weights_from_tensor``, colocated).

megatron-core assumes CUDA in places the CPU run reaches; the plasmid-megatron test support
``plugins/trainers/megatron/tests/cpu_shim_plugin.py`` patches them. It changes global torch
behaviour, so it is applied only in the training subprocess, the same way plasmid-megatron's own
e2e test does it: passed by *path* to ``--plugins`` (plasmid loads a plugin file before building any
provider). Nothing from the megatron tests is imported into this pytest process, and no conftest
path is changed. On a machine without a GPU the subprocess also gets ``cpu_trainer_standin`` first
on its ``PYTHONPATH`` (test support: SGLang's CUDA-built ``flash_mla`` raises ``OSError`` on import
there, which megatron-core's probe does not catch); the servers get the ``sgl_kernel`` stand-in.

Log-probs: the trainer recomputes every sampled token's log-prob after the sync and the loop
reports the mean absolute difference to the engine's (``train/train_rollout_logprob_abs_diff``);
both sides compute in float32 (plasmid serves a float32 checkpoint in float32), so they differ
only by the order of float32 operations: measured 7e-8 to 9e-8 per step here (3 buckets of 26
tensors, 531200 bytes per sync); the bound is 1e-5, as for the torchtrain trainer on SGLang.
Takes 4-7 minutes on a loaded two-core machine (the server's start dominates; about 80 s of CPU).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sglang_test_support import HERE, gpu_available, server_env, sglang_installed

SHIM_PLUGIN = Path(__file__).resolve().parents[3] / "trainers" / "megatron" / "tests" / "cpu_shim_plugin.py"
LOGPROB_BOUND = 1e-5
STEPS = 3
#: TEST SUPPORT ONLY: hides the CUDA-built flash_mla from a CPU trainer (see its docstring)
TRAINER_STANDIN = HERE / "cpu_trainer_standin"

pytestmark = [
    pytest.mark.skipif(not sglang_installed(), reason="SGLang is not installed"),
    pytest.mark.skipif(importlib.util.find_spec("megatron") is None
                       or importlib.util.find_spec("plasmid_megatron") is None,
                       reason="megatron-core and plasmid-megatron are not installed (the sglang tox env has both)"),
]


@pytest.mark.timeout(600)
def test_megatron_trains_sglang_serves_every_step_syncs_flattened_buckets_and_logprobs_match(tmp_path):
    assert SHIM_PLUGIN.is_file(), f"plasmid-megatron's CPU shim moved: {SHIM_PLUGIN}"
    run_dir = tmp_path / "run"
    env_options = [option for entry in server_env() for option in ("--sglang-server-env", entry)]
    command = [sys.executable, "-m", "plasmid.app.cli", "train", "--trainer", "megatron", "--engine", "sglang",
               "--weight-sync", "sglang-tensor", "--update-weight-buffer-size", "200000",
               "--plugins", str(SHIM_PLUGIN), "--run-dir", str(run_dir), "--save-interval", "0",
               "--num-rollouts", str(STEPS), "--prompts-per-step", "4", "--n-samples-per-prompt", "4",
               "--eval-interval", "0", "--sglang-skip-tokenizer-init", "false", "--sglang-health-interval", "5",
               *env_options]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    if not gpu_available():
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TRAINER_STANDIN), os.environ.get("PYTHONPATH")]))
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=560)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "trainer=megatron" in proc.stderr and "engine=sglang" in proc.stderr
    assert "weight-sync=sglang-tensor" in proc.stderr
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert len(metrics) == STEPS
    assert all(m["weight_version"] == m["step"] + 1 and m["train/updates"] == 1.0 for m in metrics), metrics
    for m in metrics:  # a sync each step, in several flattened buckets, one tensor on the wire per bucket
        assert m["sync/bytes"] > 0 and m["sync/buckets"] > 1 and m["sync/handles"] == m["sync/buckets"]
        assert m["sync/tensors"] > m["sync/buckets"]
    diffs = [m["train/train_rollout_logprob_abs_diff"] for m in metrics]
    assert max(diffs) <= LOGPROB_BOUND, f"engine and trainer log-probs disagree: max {max(diffs):.2e}"
