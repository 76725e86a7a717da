"""End to end: ``plasmid train --generate agent --agent FILE:FUNC`` on the quickstart's tiny model
(CPU, no downloads), the README's ten-line agent driving it through the real ``openai`` client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

AGENT = Path(__file__).parent / "agents.py"


@pytest.mark.timeout(240)
def test_plasmid_train_with_an_openai_agent_exits_0_and_trains_on_the_engines_logprobs(tmp_path):
    run_dir = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-m", "plasmid.app.cli", "train", "--generate", "agent",
                           "--agent", f"{AGENT}:answer", "--num-rollouts", "2", "--prompts-per-step", "4",
                           "--n-samples-per-prompt", "4", "--agent-concurrency", "8", "--eval-interval", "0",
                           "--save-interval", "0", "--run-dir", str(run_dir)],
                          capture_output=True, text=True, env=env, timeout=220)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "generate=agent" in proc.stderr and "reward=agent" in proc.stderr
    assert "Traceback" not in proc.stderr and "CancelledError" not in proc.stderr
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert len(metrics) == 2
    for step in metrics:
        assert step["train/samples"] == 16.0 and "rollout/reward/agent" in step
        assert 0.0 <= step["rollout/reward_mean"] <= 1.0
        assert step["train/train_rollout_logprob_abs_diff"] <= 1e-4, "the gateway's log-probs are the engine's"
        # the README's agent makes one call per session, one sample, no branch, no error
        assert (step["rollout/agent/calls_mean"], step["rollout/agent/samples_mean"],
                step["rollout/agent/branches_mean"], step["rollout/agent/errors_fraction"]) == (1.0, 1.0, 0.0, 0.0)
        assert step["rollout/agent/prompt_tokens_mean"] > 0 and step["rollout/agent/completion_tokens_mean"] >= 1
        assert step["rollout/agent/seconds_mean"] > 0


@pytest.mark.timeout(300)
def test_an_agent_returning_one_reward_per_call_trains_with_turn_credit(tmp_path, capsys, monkeypatch):
    """``[0.0, 1.0]`` over two calls of one sample: the saved samples carry both rewards at their calls'
    offsets, and ``--turn-credit by-turn`` hands the grpo loss those turns (real plasmid train)."""
    import torch
    from plasmid_grpo.loss import GRPOLoss

    from plasmid.app.cli import main
    from plasmid.app.rollout_store import RolloutStore
    from plasmid_torch.turns import TURN_REWARDS_KEY, TurnLossBatch

    seen = []
    real = GRPOLoss.turn_advantages

    def spy(self, batch, rewards):
        seen.append(batch)
        return real(self, batch, rewards)

    monkeypatch.setattr(GRPOLoss, "turn_advantages", spy)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    run_dir, saved = tmp_path / "run", tmp_path / "rollouts"
    code = main(["train", "--generate", "agent", "--agent", f"{AGENT}:two_calls_rewarded_per_call",
                 "--num-rollouts", "1", "--prompts-per-step", "4", "--n-samples-per-prompt", "2",
                 "--turn-credit", "by-turn", "--eval-interval", "0", "--save-interval", "0",
                 "--run-dir", str(run_dir), "--save-rollouts", str(saved)])
    assert code == 0, capsys.readouterr().err[-3000:]
    [step] = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert step["rollout/reward_mean"] == 1.0 and step["rollout/agent/calls_mean"] == 2.0
    assert step["rollout/agent/samples_mean"] == 1.0, "the second call extends the first: one sample"
    offsets = []
    for sample in RolloutStore(saved).load(0).samples:
        first, second = sample.metadata[TURN_REWARDS_KEY]
        assert first == [0, 0.0] and second[1] == 1.0 and sample.reward == 1.0
        offset = second[0]
        assert sample.loss_mask[offset - 1:offset + 1] == [0, 1], "the second turn starts at its call's completion"
        assert sample.loss_mask[0] == 1, "the first turn starts at the first call's completion"
        offsets.append(offset)
    [batch] = seen
    assert isinstance(batch, TurnLossBatch) and batch.turn_rewards.tolist() == [[0.0, 1.0]] * 8
    assert torch.equal(torch.nansum(batch.turn_rewards, -1), batch.rewards.float())
    starts = [int(row.tolist().index(1)) for row in batch.turn_index]
    assert sorted(starts) == sorted(offsets), "each token's turn is the call it came from"
