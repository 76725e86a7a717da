"""The agent function of ``--datasource verifiers``: the environment's own rollout loop, driven
through plasmid's agent gateway (``--generate agent --agent plasmid_verifiers.rollout:run``).

The gateway renders each chat request with the model's chat template, generates with the rollout
engine and records the exact token ids and log-probs of every call; it turns the calls into the
sample(s) (a turn that extends the previous one extends its sample: no re-tokenisation). This
module owns only the messages and the score: verifiers' ``Environment.rollout`` (single-turn,
multi-turn, tool environments alike) with an ``OpenAIChatCompletionsClient`` over an
``AsyncOpenAI`` at the session's base URL, then ``rubric.score_rollout`` on the final state, and
the per-step rewards of its trajectory, one per model call, which plasmid-agent turns into the
samples' per-turn rewards.
"""

from __future__ import annotations

from typing import Any

from plasmid_serving.turns import TURN_REWARDS_KEY
from plasmid_verifiers import vf

#: The key of the returned dict (the agent reward) holding the rubric's weighted score.
TOTAL_KEY = "reward"


def step_rewards(state: Any) -> list[float] | None:
    """The reward of each step of ``state["trajectory"]`` (one step per model call; verifiers'
    ``TrajectoryStep.reward``, which an environment sets in ``add_trajectory_step`` or with
    ``State.add_step_reward``), a step without one as 0.0; ``None`` when no step has one."""
    rewards = [step.get("reward") for step in state.get("trajectory") or []]
    if all(reward is None for reward in rewards):
        return None
    return [0.0 if reward is None else float(reward) for reward in rewards]


async def run(session: Any) -> dict[str, float | list[float]]:
    """One rollout of the sample's dataset row (``session.label``, made by the ``verifiers`` data
    source); returns ``{"reward": the rubric's weighted score, FUNC: each function's score}``, and
    when the environment gave per-step rewards, ``"turn_rewards"``: one per model call
    (:func:`step_rewards`), which plasmid-agent writes as each sample's ``metadata["turn_rewards"]``
    at its calls' offsets (``--turn-credit`` reads them; the sample's reward stays the rubric's
    score, and their sum is logged as ``rollout/reward/verifiers.turn_rewards``).
    A rollout that verifiers ends with an error raises (the run stops naming the sample).

    A v1 taskset's row is run by :meth:`plasmid_verifiers.v1.V1Taskset.rollout`: one episode of its
    task, scored by verifiers (v1 rewards the whole trace, so there are no per-turn rewards)."""
    from openai import AsyncOpenAI
    from verifiers.clients import OpenAIChatCompletionsClient

    label = session.label
    if not isinstance(label, dict) or "row" not in label or "env" not in label:
        raise ValueError("the sample's label is not a verifiers dataset row: plasmid_verifiers.rollout:run runs "
                         "the prompts of --datasource verifiers")
    env = vf.load_env(label["env"], vf.canonical_args(label.get("env_args") or {}))
    if vf.is_v1(env):
        total, parts = await env.rollout(int(label["row"]["task"]), session.base_url, session.model)
        return {TOTAL_KEY: total, **{name: value for name, value in parts.items() if name != TOTAL_KEY}}
    client = OpenAIChatCompletionsClient(AsyncOpenAI(base_url=session.base_url, api_key=session.api_key,
                                                     max_retries=0))
    state = await env.rollout(dict(label["row"]), client, session.model)
    if state.get("error") is not None:
        error = state["error"]
        cause = error.__cause__ or error
        raise RuntimeError(f"verifiers environment {label['env']} ended the rollout with "
                           f"{type(error).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}")
    total, metrics = await vf.score_state(env, state)
    result: dict[str, float | list[float]] = {
        TOTAL_KEY: total, **{name: value for name, value in metrics.items() if name != TOTAL_KEY}}
    per_step = step_rewards(state)
    if per_step is not None:
        result[TURN_REWARDS_KEY] = per_step
    return result
