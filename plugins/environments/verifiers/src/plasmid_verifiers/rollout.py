"""The agent function of ``--datasource verifiers``: the environment's own rollout loop, driven
through plasmid's agent gateway (``--generate agent --agent plasmid_verifiers.rollout:run``).

The gateway renders each chat request with the model's chat template, generates with the rollout
engine and records the exact token ids and log-probs of every call; it turns the calls into the
sample(s) (a turn that extends the previous one extends its sample: no re-tokenisation). This
module owns only the messages and the score: verifiers' ``Environment.rollout`` (single-turn,
multi-turn, tool environments alike) with an ``OpenAIChatCompletionsClient`` over an
``AsyncOpenAI`` at the session's base URL, then ``rubric.score_rollout`` on the final state.
"""

from __future__ import annotations

from typing import Any

from plasmid_verifiers import vf

#: The key of the returned dict (the agent reward) holding the rubric's weighted score.
TOTAL_KEY = "reward"


async def run(session: Any) -> dict[str, float]:
    """One rollout of the sample's dataset row (``session.label``, made by the ``verifiers`` data
    source); returns ``{"reward": the rubric's weighted score, FUNC: each function's score}``.
    A rollout that verifiers ends with an error raises (the run stops naming the sample)."""
    from openai import AsyncOpenAI
    from verifiers.clients import OpenAIChatCompletionsClient

    label = session.label
    if not isinstance(label, dict) or "row" not in label or "env" not in label:
        raise ValueError("the sample's label is not a verifiers dataset row: plasmid_verifiers.rollout:run runs "
                         "the prompts of --datasource verifiers")
    env = vf.load_env(label["env"], vf.canonical_args(label.get("env_args") or {}))
    client = OpenAIChatCompletionsClient(AsyncOpenAI(base_url=session.base_url, api_key=session.api_key,
                                                     max_retries=0))
    state = await env.rollout(dict(label["row"]), client, session.model)
    if state.get("error") is not None:
        error = state["error"]
        cause = error.__cause__ or error
        raise RuntimeError(f"verifiers environment {label['env']} ended the rollout with "
                           f"{type(error).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}")
    total, metrics = await vf.score_state(env, state)
    return {TOTAL_KEY: total, **{name: value for name, value in metrics.items() if name != TOTAL_KEY}}
