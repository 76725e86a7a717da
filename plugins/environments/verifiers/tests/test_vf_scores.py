"""plasmid's ``verifiers`` reward equals what verifiers computes itself on the same completions,
for a single-turn and a tool environment whose rollouts run through the agent gateway.

The engine is scripted (its replies are fixed texts, its log-probs known), so the completions are
known; the reference score is verifiers' own ``rubric.score_rollout`` on the state verifiers
builds for the dataset row (``init_state``) holding those completions as verifiers' messages.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
from types import SimpleNamespace

import pytest
from plasmid_verifiers import plugin, vf

from plasmid.testing import build, make_config, run
from plasmid.types import GenerationOutput, SamplingParams, Status

#: plasmid-agent's hooks, found as plasmid finds them (its entry point), not imported by name.
AGENT_PLUGIN = next(ep for ep in importlib.metadata.entry_points(group="plasmid") if ep.name == "agent").load()


class ScriptedEngine:
    """Answers call ``k`` with the ids of ``texts[k]`` and log-probs ``-0.01 * (k + 1) * (i + 1)``."""

    weight_version = 1

    def __init__(self, tokenizer, texts):
        self.replies = [tokenizer.encode(text, add_special_tokens=False) for text in texts]
        self.prompts: list[list[int]] = []

    async def generate(self, prompt_ids, params):
        k = len(self.prompts)
        self.prompts.append(list(prompt_ids))
        ids = self.replies[k][:params.max_new_tokens]
        return GenerationOutput(ids, [-0.01 * (k + 1) * (i + 1) for i in range(len(ids))], Status.COMPLETED, 1)

    async def abort_all(self):
        return 0


def rollout(tmp_path, model: str, env_name: str, texts: list[str], **options):
    """``(sample, out, engine, source, config)``: one prompt of ``env_name`` rolled out by
    ``--generate agent`` with the recipe's agent and the scripted engine (``options``: more options)."""
    config = make_config(plugin, AGENT_PLUGIN, run_dir=tmp_path, datasource="verifiers", vf_env=env_name,
                         max_new_tokens=128, model=model, **options)
    source = build("datasource", "verifiers", plugin, config=config)
    sample = source.get_groups(1)[0].samples[0]
    generate = build("generate", "agent", AGENT_PLUGIN, config=config)
    engine = ScriptedEngine(source.tokenizer, texts)
    ctx = SimpleNamespace(tokenizer=source.tokenizer, engine_for=lambda s: engine, aborting=asyncio.Event())
    params = SamplingParams(max_new_tokens=128, stop_token_ids=(source.tokenizer.eos_token_id,))
    out = run(generate(ctx, sample, params))
    return sample, out, engine, source, config


def verifiers_score(env_name: str, row: dict, completion: list[dict]) -> tuple[float, dict]:
    """verifiers' own score of ``completion`` (OpenAI-style messages) for ``row``."""
    import verifiers
    from openai import AsyncOpenAI
    from verifiers.clients import OpenAIChatCompletionsClient
    from verifiers.utils.message_utils import normalize_messages

    env = verifiers.load_environment(env_name)

    async def score():
        client = OpenAIChatCompletionsClient(AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="x"))
        state = await env.init_state(row, client, "m")
        state["completion"] = normalize_messages(completion, field_name="completion")
        await env.rubric.score_rollout(state)
        return state["reward"], state["metrics"]

    return run(score())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("right", [True, False])
def test_single_turn_reward_equals_verifiers_rubric(tmp_path, tiny_model, right):
    config = make_config(plugin, run_dir=tmp_path / "probe", datasource="verifiers", vf_env="vf_plasmid_sum",
                         model=tiny_model)
    first = build("datasource", "verifiers", plugin, config=config).get_groups(1)[0].samples[0]
    reply = first.label["row"]["answer"] if right else "12345"
    sample, out, engine, source, config = rollout(tmp_path / "run", tiny_model, "vf_plasmid_sum", [reply])
    assert sample.label == first.label
    reply_ids = source.tokenizer.encode(reply, add_special_tokens=False)
    assert out.tokens == engine.prompts[0] + reply_ids and out.response_length == len(reply_ids)
    assert out.loss_mask == [1] * len(reply_ids)
    assert out.rollout_logprobs == pytest.approx([-0.01 * (i + 1) for i in range(len(reply_ids))])
    reward = run(build("reward", "verifiers", plugin, config=config)(out))
    expected, metrics = verifiers_score("vf_plasmid_sum", sample.label["row"], [{"role": "assistant",
                                                                               "content": reply}])
    assert reward.value == expected
    assert metrics["exact"] == float(right) and metrics["short"] == max(0.0, 1 - len(reply) / 8)
    assert reward.parts["exact"] == metrics["exact"] and reward.parts["short"] == metrics["short"], \
        "every rubric function's score is a part of the reward"
    recorded = dict(out.metadata["agent_reward"])
    assert recorded.pop("num_turns") == 1.0, "verifiers' own turn count (0 in the reference: no trajectory)"
    assert recorded == {"reward": expected, **{k: v for k, v in metrics.items() if k != "num_turns"}}
    # num_turns is a part because verifiers itself puts it on the rubric (MultiTurnEnv's add_metric, weight 0):
    # the parts are exactly the rubric's functions, and the reward is their weighted sum, num_turns adding 0
    rubric = vf.load_env("vf_plasmid_sum").rubric
    weights = dict(zip(rubric._get_reward_func_names(), rubric._get_reward_weights(), strict=True))
    assert weights == {"exact": 1.0, "short": 0.25, "num_turns": 0.0} and set(reward.parts) == set(weights)
    assert reward.parts["num_turns"] == 1.0
    assert reward.value == pytest.approx(sum(weight * reward.parts[name] for name, weight in weights.items()))
    # the same response scored without the rollout's record (another generate, plasmid score)
    bare = SimpleNamespace(index=0, label=out.label, response=out.response, metadata={})
    bare_reward = run(build("reward", "verifiers", plugin, config=config)(bare))
    assert bare_reward.value == expected
    assert (bare_reward.parts["exact"], bare_reward.parts["short"]) == (metrics["exact"], metrics["short"])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("right", [True, False])
def test_tool_environment_calls_the_tool_and_its_reward_equals_verifiers_rubric(tmp_path, tiny_model, right):
    config = make_config(plugin, run_dir=tmp_path / "probe", datasource="verifiers", vf_env="vf_plasmid_tool",
                         model=tiny_model)
    row = build("datasource", "verifiers", plugin, config=config).get_groups(1)[0].samples[0].label["row"]
    a, b = (int(x) for x in row["question"].rstrip("=").split("+"))
    call = f'<tool_call>{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'
    answer = str(a + b) if right else str(a + b + 1)
    _, out, engine, source, config = rollout(tmp_path / "run", tiny_model, "vf_plasmid_tool", [call, answer])
    tokenizer = source.tokenizer
    call_ids = tokenizer.encode(call, add_special_tokens=False)
    answer_ids = tokenizer.encode(answer, add_special_tokens=False)
    assert len(engine.prompts) == 2, "one model call per turn: the call, then the answer"
    # the second turn's prompt extends the first call's prompt and completion: one sample, no re-tokenisation
    first_turn = engine.prompts[0] + call_ids
    assert tokenizer.decode(engine.prompts[1][:len(first_turn)]) == tokenizer.decode(first_turn)
    assert engine.prompts[1][:len(first_turn)] == first_turn
    tool_turn = engine.prompts[1][len(first_turn):]
    assert tokenizer.decode(tool_turn) == f"<eos><tool>{a + b}<assistant>".replace("<eos>", tokenizer.eos_token)
    assert out.tokens == engine.prompts[1] + answer_ids
    assert out.loss_mask == [1] * len(call_ids) + [0] * len(tool_turn) + [1] * len(answer_ids)
    assert out.rollout_logprobs == pytest.approx([-0.01 * (i + 1) for i in range(len(call_ids))]
                                                 + [0.0] * len(tool_turn)
                                                 + [-0.02 * (i + 1) for i in range(len(answer_ids))])
    reward = run(build("reward", "verifiers", plugin, config=config)(out))
    completion = [{"role": "assistant", "content": None, "tool_calls": [
                      {"id": "c0", "type": "function",
                       "function": {"name": "add", "arguments": json.dumps({"a": a, "b": b})}}]},
                  {"role": "tool", "tool_call_id": "c0", "content": str(a + b)},
                  {"role": "assistant", "content": answer}]
    expected, metrics = verifiers_score("vf_plasmid_tool", row, completion)
    assert reward.value == expected == float(right)
    assert reward.parts["exact"] == metrics["exact"] and reward.parts["add_calls"] == metrics["add_calls"]
    assert out.metadata["agent_reward"]["exact"] == metrics["exact"] == float(right)
    assert out.metadata["agent_reward"]["add_calls"] == metrics["add_calls"] == 1.0
    assert vf.reward_names(vf.load_env("vf_plasmid_tool"))[0] == "exact"


@pytest.mark.timeout(120)
def test_the_environments_step_rewards_become_the_samples_turn_rewards(tmp_path, tiny_model):
    """vf_plasmid_tool with ``tool_step_reward``: the turn that calls ``add`` earns 0.5 in verifiers'
    trajectory, the answer's turn nothing; the sample carries both at their calls' offsets, and its
    reward stays the rubric's score."""
    args = '{"tool_step_reward": 0.5}'
    config = make_config(plugin, run_dir=tmp_path / "probe", datasource="verifiers", vf_env="vf_plasmid_tool",
                         vf_env_args=args, model=tiny_model)
    row = build("datasource", "verifiers", plugin, config=config).get_groups(1)[0].samples[0].label["row"]
    a, b = (int(x) for x in row["question"].rstrip("=").split("+"))
    call = f'<tool_call>{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'
    _, out, engine, _, config = rollout(tmp_path / "run", tiny_model, "vf_plasmid_tool", [call, str(a + b)],
                                        vf_env_args=args)
    second_offset = len(engine.prompts[1]) - len(engine.prompts[0])
    assert out.loss_mask[second_offset - 1:second_offset + 1] == [0, 1], "the answer's turn starts at its tokens"
    assert out.metadata["turn_rewards"] == [[0, 0.5], [second_offset, 0.0]]
    reward = run(build("reward", "verifiers", plugin, config=config)(out))
    assert reward.value == reward.parts["exact"] == 1.0, "the rubric's score is still the reward"
    assert reward.parts["turn_rewards"] == 0.5, "the sum of the step rewards is logged beside the rubric's"
    plain = rollout(tmp_path / "plain", tiny_model, "vf_plasmid_tool", [call, str(a + b)])[1]
    assert "turn_rewards" not in plain.metadata, "an environment that sets no step reward gives no turns"
