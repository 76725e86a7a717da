"""An agent that returns one reward per model call (a list, or a dict's ``"turn_rewards"`` entry):
each sample gets ``metadata["turn_rewards"]``, its calls' rewards at their completions' offsets,
and the sum of those as its reward. A scripted engine makes the tokens known."""

from __future__ import annotations

import plasmid_agent.plugin
import pytest
from conftest import ScriptedEngine
from plasmid_agent.generate import checked_reward
from test_agent_protocol import client_of, run_agent

from plasmid.errors import ProviderError
from plasmid.rewards import RewardComponent, RewardSet
from plasmid.testing import build, make_config, run
from plasmid_serving.turns import TURN_REWARDS_KEY, checked_turn_rewards


def follow_ups(calls, result):
    """An agent that makes ``calls`` chat calls, each on the conversation so far plus a new user
    message (each extends the one before: one sample), and returns ``result``."""
    async def agent(session):
        client = client_of(session)
        messages = list(session.messages)
        reply = await client.chat.completions.create(model=session.model, messages=messages)
        for turn in range(1, calls):
            messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                         {"role": "user", "content": f"more {turn}"}]
            reply = await client.chat.completions.create(model=session.model, messages=messages)
        return result
    return agent


def test_a_list_over_two_calls_of_one_sample_puts_each_reward_at_its_calls_offset(tmp_path, tool_tokenizer):
    engine = ScriptedEngine(tool_tokenizer, ["ab<eos>", "c<eos>"])
    out = run_agent(tmp_path, follow_ups(2, [0.0, 1.0]), tool_tokenizer, engine)
    (first_prompt, _), (second_prompt, _) = engine.seen
    second_offset = len(second_prompt) - len(first_prompt)
    assert out.loss_mask[second_offset - 1:second_offset + 1] == [0, 1], "the second turn starts at its completion"
    assert out.metadata[TURN_REWARDS_KEY] == [[0, 0.0], [second_offset, 1.0]]
    assert checked_turn_rewards(out.metadata[TURN_REWARDS_KEY], out.response_length, "out") == [
        (0, 0.0), (second_offset, 1.0)]
    assert out.metadata["agent_reward"] == 1.0, "the sample's reward is the sum of its turns"
    assert run(build("reward", "agent", plasmid_agent.plugin)(out)) == 1.0


def test_branches_get_the_rewards_of_their_own_calls(tmp_path, tool_tokenizer):
    """Calls 0 and 1 make one sample, call 2 branches from call 0 (a sample of its own)."""
    engine = ScriptedEngine(tool_tokenizer, ["a<eos>", "b<eos>", "c<eos>"])

    async def agent(session):
        client = client_of(session)
        first = await client.chat.completions.create(model=session.model, messages=session.messages)
        history = [*session.messages, {"role": "assistant", "content": first.choices[0].message.content}]
        await client.chat.completions.create(model=session.model, messages=history + [{"role": "user", "content": "x"}])
        await client.chat.completions.create(model=session.model, messages=history + [{"role": "user", "content": "y"}])
        return [0.5, 2.0, -1.0]

    continued, branch = run_agent(tmp_path, agent, tool_tokenizer, engine)
    prompts = [ids for ids, _ in engine.seen]
    assert continued.metadata[TURN_REWARDS_KEY] == [[0, 0.5], [len(prompts[1]) - len(prompts[0]), 2.0]]
    assert continued.metadata["agent_reward"] == 2.5
    assert branch.metadata[TURN_REWARDS_KEY] == [[0, -1.0]] and branch.metadata["agent_reward"] == -1.0


def test_a_call_that_made_no_token_adds_its_reward_to_a_neighbouring_turn(tmp_path, tool_tokenizer):
    engine = ScriptedEngine(tool_tokenizer, ["", "b<eos>", "", "d<eos>"])
    out = run_agent(tmp_path, follow_ups(4, [0.25, 1.0, 2.0, 4.0]), tool_tokenizer, engine)
    prompts = [ids for ids, _ in engine.seen]
    second, fourth = len(prompts[1]) - len(prompts[0]), len(prompts[3]) - len(prompts[0])
    assert out.metadata[TURN_REWARDS_KEY] == [[second, 3.25], [fourth, 4.0]], \
        "the first call's reward joins the next turn, the third call's the turn before it"
    assert out.metadata["agent_reward"] == 7.25


def test_a_dict_with_per_call_rewards_logs_every_other_key_as_a_metric(tmp_path, tool_tokenizer):
    engine = ScriptedEngine(tool_tokenizer, ["ab<eos>", "c<eos>"])
    out = run_agent(tmp_path, follow_ups(2, {TURN_REWARDS_KEY: [0.0, 1.0], "format": 0.5, "tools": 2}),
                    tool_tokenizer, engine)
    assert [reward for _, reward in out.metadata[TURN_REWARDS_KEY]] == [0.0, 1.0]
    assert out.metadata["agent_reward"] == {TURN_REWARDS_KEY: 1.0, "format": 0.5, "tools": 2.0}
    rewards = RewardSet([RewardComponent("agent", 1.0, build("reward", "agent", plasmid_agent.plugin))])
    run(rewards.score_group([out]))
    assert out.reward == 1.0, "without --reward-key the reward is the sum of the sample's turns"
    assert out.reward_components == {"agent": 1.0, "agent.turn_rewards": 1.0, "agent.format": 0.5,
                                     "agent.tools": 2.0}
    chosen = build("reward", "agent", plasmid_agent.plugin,
                   config=make_config(plasmid_agent.plugin, reward_key="format"))
    assert run(chosen(out)).value == 0.5, "--reward-key still picks the reward (the loss credits the rest)"


def test_a_list_of_the_wrong_length_is_a_failed_agent_naming_the_counts(tmp_path, tool_tokenizer):
    with pytest.raises(ProviderError, match=r"on sample 1 returned 3 per-call rewards for the 2 model calls the "
                                            r"gateway recorded; return one reward per call"):
        run_agent(tmp_path, follow_ups(2, [0.0, 1.0, 2.0]), tool_tokenizer,
                  ScriptedEngine(tool_tokenizer, ["a<eos>", "b<eos>"]))
    out = run_agent(tmp_path, follow_ups(1, [1.0]), tool_tokenizer, ScriptedEngine(tool_tokenizer, ["a<eos>"]))
    assert out.metadata[TURN_REWARDS_KEY] == [[0, 1.0]]
    zero = run_agent(tmp_path, follow_ups(2, [0.0, 1.0, 2.0]), tool_tokenizer,
                     ScriptedEngine(tool_tokenizer, ["a<eos>", "b<eos>"]), agent_errors="zero")
    assert zero.metadata["agent_reward"] == 0.0 and TURN_REWARDS_KEY not in zero.metadata
    assert "2 model calls" in zero.metadata["agent_error"]


@pytest.mark.parametrize(("value", "message"), [
    ([], r"w returned \[\]; per-call rewards are a non-empty list"),
    ([1.0, "x"], r"w\[1\] returned str 'x'"),
    ([1.0, float("inf")], r"w\[1\] returned the non-finite reward inf"),
    ({TURN_REWARDS_KEY: [1.0], "a": [1.0]}, r"w\['a'\] returned list \[1.0\]; return the reward"),
    ({TURN_REWARDS_KEY: 1.0}, r"w\['turn_rewards'\] returned 1.0; per-call rewards are a non-empty list"),
    ({TURN_REWARDS_KEY: [True]}, r"w\['turn_rewards'\]\[0\] returned bool True"),
])
def test_bad_per_call_rewards_are_one_line_errors_naming_the_entry(value, message):
    with pytest.raises((TypeError, ValueError), match=message):
        checked_reward(value, "w")


def test_checked_reward_keeps_the_three_forms():
    assert checked_reward(1, "w") == 1.0
    assert checked_reward((0, 1.5), "w") == [0.0, 1.5]
    assert checked_reward({TURN_REWARDS_KEY: [0, 1], "a": 2}, "w") == {TURN_REWARDS_KEY: [0.0, 1.0], "a": 2.0}


def test_the_generate_function_and_reward_write_turns_without_importing_torch():
    """plasmid-agent depends on plasmid and plasmid-serving only: the turn key comes from plasmid_serving.turns."""
    import subprocess
    import sys

    code = "import sys, plasmid_agent.generate, plasmid_agent.reward; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
