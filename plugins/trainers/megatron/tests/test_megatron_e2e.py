"""``plasmid train --trainer megatron`` end to end on the CPU quickstart (embedded torchgen engine,
in-process weight sync), in a subprocess that loads ``cpu_shim_plugin.py`` (test support) so that
megatron-core runs without CUDA."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

SHIM_PLUGIN = Path(__file__).resolve().parent / "cpu_shim_plugin.py"


def train(run_dir: Path, *options: str, timeout: float = 600) -> list[dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, "-m", "plasmid.app.cli", "train", "--trainer", "megatron",
                           "--plugins", str(SHIM_PLUGIN), "--run-dir", str(run_dir), "--save-interval", "0", *options],
                          capture_output=True, text=True, env=env, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "trainer=megatron" in proc.stderr
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_a_short_run_trains_syncs_and_checkpoints(tmp_path):
    metrics = train(tmp_path / "run", "--num-rollouts", "3", "--prompts-per-step", "4", "--n-samples-per-prompt", "4",
                    "--eval-interval", "3", "--micro-batch-size", "5")
    assert len(metrics) == 3
    assert all(m["train/updates"] == 1.0 and m["weight_version"] == m["step"] + 1 for m in metrics)
    assert max(m["train/train_rollout_logprob_abs_diff"] for m in metrics) <= 1e-4
    checkpoint = next((tmp_path / "run" / "checkpoints").iterdir()) / "trainer"
    assert (checkpoint / "model" / "model.safetensors").is_file()
    assert (checkpoint / "dist" / "metadata.json").is_file() and (checkpoint / "rng" / "rank_00000.pt").is_file()


@pytest.mark.slow
def test_quickstart_reward_rises_and_logprobs_match(tmp_path):
    metrics = train(tmp_path / "run", "--num-rollouts", "150", "--eval-interval", "75")
    assert len(metrics) == 150
    rewards = [m["rollout/reward_mean"] for m in metrics]
    first, last = statistics.mean(rewards[:10]), statistics.mean(rewards[-10:])
    assert first < 0.25, f"the untrained model should be near chance (0.1), got {first:.2f}"
    assert last > first + 0.15, f"reward did not rise: first 10 steps {first:.2f}, last 10 steps {last:.2f}"
    diffs = [m["train/train_rollout_logprob_abs_diff"] for m in metrics]
    assert max(diffs) <= 1e-4, f"engine and trainer log-probs disagree after sync: max {max(diffs):.2e}"
    assert metrics[-1]["eval/accuracy"] > 0.5


def test_routing_replay_r3_runs_end_to_end_on_the_engines_routing(tmp_path):
    """``--routing-replay r3`` through ``plasmid train``: start-up turns on ``--return-routed-experts``,
    torchgen reports each sample's expert choices, the samples carry them (``--save-rollouts``: one
    entry per token but the last, one list of top-k experts per MoE layer) and megatron replays them
    in every pass of the step, on a tiny Qwen2-MoE with the quickstart's tokenizer."""
    from test_megatron_moe import build_moe_model

    from plasmid.app.rollout_store import RolloutStore
    from plasmid.types import ROUTED_EXPERTS_KEY

    model = build_moe_model(tmp_path / "moe", "qwen2_moe")
    saved = tmp_path / "rollouts"
    metrics = train(tmp_path / "run", "--model", str(model), "--routing-replay", "r3", "--num-rollouts", "2",
                    "--prompts-per-step", "4", "--n-samples-per-prompt", "4", "--eval-interval", "0",
                    "--save-rollouts", str(saved))
    assert [m["step"] for m in metrics] == [0, 1]
    assert max(m["train/train_rollout_logprob_abs_diff"] for m in metrics) <= 1e-4
    samples = [s for step in (0, 1) for group in RolloutStore(saved).load(step).groups for s in group.samples]
    config = json.loads((model / "config.json").read_text())
    for sample in samples:
        routes = sample.metadata[ROUTED_EXPERTS_KEY]
        assert len(routes) == len(sample.tokens) - 1
        assert all(len(layers) == config["num_hidden_layers"] and
                   all(len(experts) == config["num_experts_per_tok"] for experts in layers) for layers in routes)
