"""Real clients drive real runs: ``plasmid train --generate agent`` on the quickstart's tiny model
(CPU, two small steps) with agents of ``client_agents.py``: the ``openai`` client (tools, ``n``,
``stop``, streaming), the OpenAI Agents SDK (Chat Completions and Responses model classes) and
PydanticAI. Each run exits 0 and trains; every model turn a chat client was sent (tokens and
log-probs, as the client read them) is, exactly, a run of trained tokens (``loss_mask`` 1) of a
saved sample with the same log-probs, and those log-probs are what the trainer computes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from plasmid_torch.tiny import char_tokenizer

AGENTS = Path(__file__).parent / "client_agents.py"


def train(tmp_path: Path, agent: str, run_args: tuple[str, ...] | None = None,
          steps: tuple[int, int, int] = (2, 4, 2), max_new_tokens: int = 16
          ) -> tuple[list[dict], list[dict], list[dict]]:
    """Run ``plasmid train --generate agent`` with ``agent`` of ``client_agents.py``: ``steps`` is
    (rollouts, prompts per step, samples per prompt) and ``run_args`` the arguments before
    ``--generate`` (default: the quickstart's model with this file's tool parser). The run's metrics,
    saved samples and the client log."""
    run_dir, log = tmp_path / "run", tmp_path / "client.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PLASMID_CLIENT_LOG": str(log)}
    # --plugins FILE (a local module, the installed plugins stay on) registers the tool parser before start-up
    run_args = ("--plugins", str(AGENTS), "--tool-parser", "tiny-digits") if run_args is None else run_args
    rollouts, prompts, samples_per_prompt = steps
    proc = subprocess.run([sys.executable, "-m", "plasmid.app.cli", "train", *run_args, "--generate", "agent",
                           "--agent", f"{AGENTS}:{agent}", "--reward-key", "correct",
                           "--num-rollouts", str(rollouts), "--prompts-per-step", str(prompts),
                           "--n-samples-per-prompt", str(samples_per_prompt),
                           "--max-new-tokens", str(max_new_tokens), "--eval-interval", "0", "--save-interval", "0",
                           "--save-rollouts", str(tmp_path / "rollouts"), "--run-dir", str(run_dir)],
                          capture_output=True, text=True, env=env, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    samples = [sample for path in sorted((tmp_path / "rollouts").glob("step_*.jsonl"))
               for line in path.read_text().splitlines()[1:] for sample in json.loads(line)["samples"]]
    client = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return metrics, samples, client


def trained_runs(sample: dict) -> list[tuple[tuple[int, ...], tuple[float, ...]]]:
    """The sample's maximal runs of ``loss_mask`` 1 response tokens, with their rollout log-probs."""
    response = sample["tokens"][len(sample["tokens"]) - sample["response_length"]:]
    runs, current = [], ([], [])
    for token, mask, logprob in zip(response, sample["loss_mask"], sample["rollout_logprobs"], strict=True):
        if mask:
            current[0].append(token)
            current[1].append(logprob)
        elif current[0]:
            runs.append(current)
            current = ([], [])
    if current[0]:
        runs.append(current)
    return [(tuple(ids), tuple(lps)) for ids, lps in runs]


def check_run(metrics, samples, client, min_samples):
    assert len(metrics) == 2
    for step in metrics:
        assert step["train/samples"] >= min_samples and "rollout/reward/agent.correct" in step
        assert step["train/train_rollout_logprob_abs_diff"] <= 1e-4, "the trainer's log-probs are the engine's"
        assert step["rollout/agent/errors_fraction"] == 0.0
    assert all(s["rollout_logprobs"] and len(s["loss_mask"]) == s["response_length"] for s in samples)
    vocab = char_tokenizer().get_vocab()
    turns = sorted((tuple(vocab[token] for token in turn["tokens"]), tuple(turn["logprobs"])) for turn in client)
    runs = sorted(run for sample in samples for run in trained_runs(sample))
    assert turns and turns == runs, "each model turn the client read is a trained run, token for token, bit for bit"


@pytest.mark.timeout(300)
def test_an_openai_client_agent_with_tools_n_stop_and_streaming_trains_on_exactly_what_it_was_sent(tmp_path):
    metrics, samples, client = train(tmp_path, "openai_tools")
    check_run(metrics, samples, client, min_samples=16)
    assert sum(step["rollout/reward/agent.tool_calls"] for step in metrics) > 0, "the model called the tool"
    assert sum(step["rollout/reward/agent.stops"] for step in metrics) > 0, "a choice ended on the stop string"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("agent", ["sdk_chat", "sdk_responses"])
def test_an_openai_agents_sdk_agent_trains_on_exactly_what_it_was_sent(tmp_path, agent):
    pytest.importorskip("agents", reason="the OpenAI Agents SDK (pip install openai-agents)")
    metrics, samples, client = train(tmp_path, agent)
    if agent == "sdk_chat":
        check_run(metrics, samples, client, min_samples=8)
    else:  # /v1/responses carries no log-probs for the tap to read: the samples and the trainer's check
        assert not client and len(metrics) == 2 and all(s["rollout_logprobs"] for s in samples)
        assert all(step["train/train_rollout_logprob_abs_diff"] <= 1e-4 for step in metrics)
        assert all(step["rollout/agent/errors_fraction"] == 0.0 for step in metrics)
    assert sum(step["rollout/reward/agent.tool_calls"] for step in metrics) > 0, "the SDK ran the tool"
    assert sum(step["rollout/agent/calls_mean"] for step in metrics) > 2, "tool results went back to the model"


@pytest.mark.timeout(300)
def test_a_pydantic_ai_agent_trains_on_exactly_what_it_was_sent(tmp_path):
    pytest.importorskip("pydantic_ai", reason="PydanticAI (pip install 'pydantic-ai-slim[openai]')")
    metrics, samples, client = train(tmp_path, "pydantic_ai_agent")
    check_run(metrics, samples, client, min_samples=8)
    assert sum(step["rollout/reward/agent.tool_calls"] for step in metrics) > 0, "PydanticAI ran the tool"
