"""The agent gateway under ``--runtime ray``: ``plasmid train --generate agent`` on the tiny
quickstart model, the gateway in the driver process beside the engine proxies, the agent (the real
``openai`` client) calling it, every call served by the Ray engine actor. Two short steps: the run
exits cleanly, trains on the engine's exact log-probs and reports the gateway's metrics."""

from __future__ import annotations

import asyncio
import json

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("openai")
pytest.importorskip("plasmid_agent")

from plasmid.app.run import run_training  # noqa: E402

#: A ten-line agent: one chat call, scored against the label.
AGENT = '''
from openai import AsyncOpenAI


async def agent(session):
    client = AsyncOpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    reply = await client.chat.completions.create(model=session.model, messages=session.messages, logprobs=True)
    assert reply.choices[0].logprobs.content, "the gateway returns the engine's log-probs"
    return float((reply.choices[0].message.content or "").strip() == str(session.label))
'''


@pytest.mark.timeout(300)
def test_generate_agent_trains_two_steps_through_the_ray_engines(ray_cluster, tmp_path):
    agent = tmp_path / "tiny_agent.py"
    agent.write_text(AGENT)
    run_dir = tmp_path / "run"
    asyncio.run(run_training([
        "--runtime", "ray", "--engines", "1", "--trainer-workers", "1", "--generate", "agent",
        "--agent", f"{agent}:agent", "--agent-concurrency", "4", "--num-rollouts", "2", "--prompts-per-step", "2",
        "--n-samples-per-prompt", "2", "--eval-interval", "0", "--save-interval", "0", "--run-dir", str(run_dir)]))
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert len(metrics) == 2
    for step in metrics:
        assert step["train/samples"] == 4.0 and "rollout/reward/agent" in step
        assert step["ray/engine0/requests"] >= 4, "every agent call went to the Ray engine actor"
        assert step["train/train_rollout_logprob_abs_diff"] <= 1e-4, "the gateway's log-probs are the engine's"
        assert step["rollout/agent/calls_mean"] == 1.0 and step["rollout/agent/errors_fraction"] == 0.0
    assert [m["weight_version"] for m in metrics] == [1.0, 2.0]
