"""``plasmid train --model DIR`` takes the converted SmolLM2-135M-Instruct: one GRPO step on chat-templated math
prompts, sampled by torchgen and trained by torchtrain, with the engine's and the trainer's log-probs agreeing and
the whole model synced."""

from __future__ import annotations

import json
import math
from pathlib import Path

from plasmid_e2e import read_metrics, run_plasmid

PROMPTS = [{"prompt": "What is 2+3? Put the final answer in \\boxed{}.", "label": "5"},
           {"prompt": "What is 10-4? Put the final answer in \\boxed{}.", "label": "6"}]


def test_plasmid_train_runs_a_grpo_step_on_smollm2(smollm2_dir, tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in PROMPTS))
    run_dir = tmp_path / "run"
    result = run_plasmid("train", "--model", str(smollm2_dir), "--datasource", "jsonl", "--prompt-data", str(data),
                         "--apply-chat-template", "--input-key", "prompt", "--label-key", "label", "--reward", "math",
                         "--num-rollouts", "1", "--prompts-per-step", "2", "--n-samples-per-prompt", "2",
                         "--max-new-tokens", "32", "--eval-interval", "0", "--save-interval", "0", "--lr", "1e-6",
                         "--run-dir", str(run_dir), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    [metrics] = read_metrics(run_dir)
    assert all(math.isfinite(value) for value in metrics.values() if isinstance(value, float)), metrics
    assert metrics["train/samples"] == 4 and metrics["train/tokens"] > 0
    parameters = 134_515_008   # tied embedding counted once
    # the engine serves the trainer's own float32 tensors (the inprocess sync shares them): every weight once,
    # nothing copied
    assert metrics["sync/shared_bytes"] == 4 * parameters and metrics["sync/bytes"] == 0
    assert metrics["train/mismatch_abs_diff"] < 1e-3, metrics   # torchgen and torchtrain agree on the real model
    saved = json.loads((run_dir / "checkpoints" / "step_000000" / "trainer" / "model" / "config.json").read_text())
    assert saved["architectures"] == ["LlamaForCausalLM"] and saved["vocab_size"] == 49152


def test_the_recipe_trains_two_steps_with_engine_and_trainer_log_probs_agreeing(smollm2_dir, tmp_path):
    """examples/real/smollm2-arithmetic.yaml, made small from the command line: two steps whose trainer log-probs
    (packed micro-batches, the LM head in chunks) equal the engine's within 1e-4 in float32."""
    root = Path(__file__).resolve().parents[2]
    run_dir = tmp_path / "recipe"
    result = run_plasmid("train", "--config", str(root / "examples" / "real" / "smollm2-arithmetic.yaml"),
                         "--model", str(smollm2_dir), "--num-rollouts", "2", "--prompts-per-step", "2",
                         "--n-samples-per-prompt", "4", "--max-new-tokens", "48", "--eval-interval", "0",
                         "--save-interval", "0", "--run-dir", str(run_dir), cwd=root, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    steps = read_metrics(run_dir)
    assert len(steps) == 2
    for metrics in steps:
        assert metrics["train/samples"] == 8 and "rollout/truncated_fraction" in metrics
        assert metrics["train/mismatch_abs_diff"] < 1e-4, metrics
