"""The gateway's OpenAI surface through the real ``openai`` client and raw HTTP, with a scripted
engine: stop strings (cut on the engine's exact tokens), ``n`` > 1, ``tool_choice``, request fields
checked by type, fields refused rather than ignored, and ``--agent-max-calls``."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest
from conftest import ScriptedEngine
from plasmid_agent.stops import cut_at_stop
from test_agent_protocol import CALCULATOR, TOOL_REPLY, client_of, http, run_agent

from plasmid.types import Status


def ids_of(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


# ---------------------------------------------------------------------------------- stop
def test_a_stop_cut_keeps_the_token_that_completed_the_stop_string_and_drops_the_rest():
    """Tokens of several characters: the stop string ends inside the third token, which is kept."""
    pieces = ["ab", "cX", "YZd", "ef"]

    def decode(ids):
        return "".join(pieces[i] for i in ids)

    cut = cut_at_stop(decode, [0, 1, 2, 3], ["XYZ", "ef"])
    assert (cut.kept, cut.text, cut.stop) == (3, "abc", "XYZ"), "the earliest stop wins, not the first listed"
    assert cut_at_stop(decode, [0, 1, 2, 3], ["nope"]) is None
    assert cut_at_stop(decode, [0, 1], ["ab"]).kept == 1 and cut_at_stop(decode, [0, 1], ["ab"]).text == ""


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_end_the_answer_before_the_stop_and_the_record_through_its_tokens(tmp_path, tool_tokenizer,
                                                                                     stream):
    engine = ScriptedEngine(tool_tokenizer, ["think 12 answer: 6<eos>"])
    seen = {}

    async def agent(session):
        client = client_of(session)
        if stream:
            chunks = [c async for c in await client.chat.completions.create(
                model=session.model, messages=session.messages, stop=["answer:", "zzz"], stream=True, logprobs=True)]
            seen["text"] = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            seen["finish"] = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        else:
            reply = await client.chat.completions.create(model=session.model, messages=session.messages,
                                                         stop="answer:", logprobs=True)
            seen["text"], seen["finish"] = reply.choices[0].message.content, reply.choices[0].finish_reason
            seen["logprobs"] = [e.logprob for e in reply.choices[0].logprobs.content]
            seen["usage"] = reply.usage.completion_tokens
        return 1.0

    out = run_agent(tmp_path, agent, tool_tokenizer, engine)
    assert seen["text"] == "think 12 " and seen["finish"] == "stop"
    kept = ids_of(tool_tokenizer, "think 12 answer:")
    assert out.response_tokens == kept == engine.replies[0][:len(kept)], "the engine's ids, through the stop"
    assert out.rollout_logprobs == [-0.01 * (i + 1) for i in range(len(kept))] and out.loss_mask == [1] * len(kept)
    assert out.status == Status.COMPLETED
    if not stream:
        assert seen["logprobs"] == out.rollout_logprobs and seen["usage"] == len(kept)


def test_a_react_loop_on_completions_continues_its_sample_past_each_stop(tmp_path, tool_tokenizer):
    """The ReAct pattern: stop on "observation:", append the observation to the text, call again."""
    engine = ScriptedEngine(tool_tokenizer, ["act: add 1 2\nobservation: 99\nmore", "final: 3<eos>"])

    async def agent(session):
        client = client_of(session)
        prompt = "q: 1+2\n"
        first = await client.completions.create(model=session.model, prompt=prompt, stop=["observation:"])
        assert first.choices[0].text == "act: add 1 2\n" and first.choices[0].finish_reason == "stop"
        prompt += first.choices[0].text + "observation: 3\n"
        second = await client.completions.create(model=session.model, prompt=prompt, stop=["observation:"])
        return float(second.choices[0].text == "final: 3")

    out = run_agent(tmp_path, agent, tool_tokenizer, engine)
    first_kept = ids_of(tool_tokenizer, "act: add 1 2\nobservation:")
    (p1, _), (p2, _) = engine.seen
    assert p2[:len(p1) + len(first_kept)] == p1 + first_kept, "the cut call's exact ids are the next prompt's prefix"
    between = p2[len(p1) + len(first_kept):]
    assert tool_tokenizer.decode(between) == " 3\n"
    assert out.tokens == p2 + engine.replies[1] and out.metadata["agent_reward"] == 1.0
    assert out.loss_mask == [1] * len(first_kept) + [0] * len(between) + [1] * len(engine.replies[1])


# ---------------------------------------------------------------------------------- n
@pytest.mark.parametrize("stream", [False, True])
def test_n_choices_are_n_engine_calls_each_its_own_sample_of_the_group(tmp_path, tool_tokenizer, stream):
    engine = ScriptedEngine(tool_tokenizer, ["a<eos>", "bb<eos>", "ccc<eos>"])
    seen = {}

    async def agent(session):
        client = client_of(session)
        if stream:
            chunks = [c async for c in await client.chat.completions.create(
                model=session.model, messages=session.messages, n=3, stream=True,
                stream_options={"include_usage": True})]
            texts = {}
            for c in chunks:
                for choice in c.choices:
                    texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            seen["texts"] = [texts[i] for i in range(3)]
            seen["usage"] = chunks[-1].usage
        else:
            reply = await client.chat.completions.create(model=session.model, messages=session.messages, n=3)
            seen["texts"] = [c.message.content for c in reply.choices]
            seen["index"] = [c.index for c in reply.choices]
            seen["usage"] = reply.usage
        return 1.0

    outs = run_agent(tmp_path, agent, tool_tokenizer, engine)
    assert seen["texts"] == ["a", "bb", "ccc"]
    assert stream or seen["index"] == [0, 1, 2]
    prompt = engine.seen[0][0]
    assert [p for p, _ in engine.seen] == [prompt] * 3
    assert len({params.seed for _, params in engine.seen}) == 3, "each choice samples with its own seed"
    assert seen["usage"].prompt_tokens == len(prompt) and seen["usage"].completion_tokens == sum(
        len(r) for r in engine.replies)
    assert isinstance(outs, list) and [o.response_tokens for o in outs] == engine.replies
    assert all(o.prompt_tokens == prompt and o.group_index == 0 for o in outs)
    assert outs[0].metadata["rollout_metrics"]["agent/calls_mean"] == 3.0


def test_the_next_turn_continues_the_choice_the_agent_kept(tmp_path, tool_tokenizer):
    engine = ScriptedEngine(tool_tokenizer, ["a<eos>", "b<eos>", "c<eos>"])

    async def agent(session):
        client = client_of(session)
        reply = await client.chat.completions.create(model=session.model, messages=session.messages, n=2)
        kept = reply.choices[1].message.content
        await client.chat.completions.create(model=session.model, messages=[
            *session.messages, {"role": "assistant", "content": kept}, {"role": "user", "content": "go"}])
        return 1.0

    first, second = run_agent(tmp_path, agent, tool_tokenizer, engine)
    assert first.response_tokens == engine.replies[0] and first.loss_mask == [1] * len(engine.replies[0])
    b, c = engine.replies[1], engine.replies[2]
    assert second.tokens == engine.seen[2][0] + c and second.tokens[:len(second.prompt_tokens) + len(b)] == (
        second.prompt_tokens + b), "choice 1's sample goes on with the turn that kept it"


# ---------------------------------------------------------------------------------- tool_choice
def test_tool_choice_none_leaves_a_call_in_the_text_as_content(tmp_path, tool_tokenizer):
    engine = ScriptedEngine(tool_tokenizer, [TOOL_REPLY, TOOL_REPLY])
    seen = {}

    async def agent(session):
        client = client_of(session)
        none = await client.chat.completions.create(model=session.model, messages=session.messages,
                                                    tools=[CALCULATOR], tool_choice="none")
        auto = await client.chat.completions.create(model=session.model, messages=session.messages,
                                                    tools=[CALCULATOR], tool_choice="auto")
        seen["none"], seen["auto"] = none.choices[0], auto.choices[0]
        return 1.0

    run_agent(tmp_path, agent, tool_tokenizer, engine)
    assert seen["none"].message.tool_calls is None and seen["none"].finish_reason == "stop"
    assert seen["none"].message.content == TOOL_REPLY.removesuffix("<eos>")
    assert seen["auto"].message.tool_calls[0].function.name == "calculator"
    assert seen["auto"].finish_reason == "tool_calls"


# ---------------------------------------------------------------------------------- bad values
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(("fields", "message"), [
    ({"temperature": "hot"}, "'temperature' must be a number from 0 to 2, got 'hot'"),
    ({"temperature": 3}, "'temperature' must be a number from 0 to 2"),
    ({"top_p": 1.5}, "'top_p' must be a number from 0 to 1"),
    ({"presence_penalty": "x"}, "'presence_penalty' must be a number"),
    ({"max_tokens": 0}, "'max_tokens' must be an integer >= 1, got 0"),
    ({"max_completion_tokens": "5"}, "'max_completion_tokens' must be an integer >= 1"),
    ({"n": 0}, "'n' must be an integer from 1 to 128, got 0"),
    ({"n": "2"}, "'n' must be an integer from 1 to 128"),
    ({"seed": 1.5}, "'seed' must be an integer, got 1.5"),
    ({"stop": 5}, "'stop' must be a non-empty string or a list of up to 4 non-empty strings, got 5"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "'stop' must be a non-empty string or a list of up to 4"),
    ({"stop": [""]}, "'stop' must be a non-empty string"),
    ({"stream": "yes"}, "'stream' must be true or false, got 'yes'"),
    ({"stream_options": {"include_usage": True}}, "'stream_options' is only allowed when 'stream' is true"),
    ({"stream": True, "stream_options": {"include_usage": "y"}}, "'stream_options.include_usage' must be true"),
    ({"logprobs": "yes"}, "'logprobs' must be true or false"),
    ({"logprobs": True, "top_logprobs": "3"}, "'top_logprobs' must be an integer from 0 to 20"),
    ({"model": 7}, "'model' must be a string"),
    ({"messages": "hi"}, "'messages' must be a non-empty list of messages"),
    ({"messages": [{"content": "x"}]}, "'messages[0]' must be an object with a string 'role'"),
    ({"messages": [{"role": "user", "content": 5}]}, "'messages[0].content' must be text or a list of text parts"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "'messages[0].content[0]' is an image, but the model 'plasmid' (the policy) is not a vision-language model"),
    ({"messages": [{"role": "user", "content": [{"type": "audio"}]}]},
     "'messages[0].content[0]': user message parts must be text and image_url parts"),
    ({"messages": [{"role": "assistant", "content": [{"type": "image_url"}]}]},
     "'messages[0].content[0]': assistant message parts must be text parts"),
    ({"tools": {"type": "function"}}, "'tools' must be a list of tools, got dict"),
    ({"tools": [{"type": "function"}]}, "'tools[0]' must be {'type': 'function', 'function'"),
    ({"tools": [{"type": "retrieval", "function": {"name": "x"}}]}, "'tools[0]' must be {'type': 'function'"),
    ({"tools": [{"type": "function", "function": {"name": ""}}]}, "'tools[0].function.name' must be a non-empty"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
     "'tools[0].function.parameters' must be a JSON schema object"),
    ({"tools": [CALCULATOR], "tool_choice": "required"}, "'tool_choice' required is not supported"),
    ({"tools": [CALCULATOR], "tool_choice": {"type": "function", "function": {"name": "calculator"}}},
     "'tool_choice' {'type': 'function'"),
    ({"tool_choice": "sometimes"}, "'tool_choice' must be 'none', 'auto', 'required' or a named function"),
    ({"functions": [{"name": "f"}]}, "'functions' (OpenAI's deprecated function calling) is not served"),
    ({"function_call": "auto"}, "'function_call' (OpenAI's deprecated function calling) is not served"),
    ({"response_format": {"type": "json_object"}}, "'response_format' 'json_object' is not supported"),
    ({"response_format": {"type": "json_schema", "json_schema": {}}}, "'response_format' 'json_schema'"),
    ({"parallel_tool_calls": False}, "'parallel_tool_calls': false is not supported"),
    ({"parallel_tool_calls": "no"}, "'parallel_tool_calls' must be true or false"),
    ({"logit_bias": {"50256": -100}}, "'logit_bias' is not supported"),
    ({"modalities": ["text", "audio"]}, "'modalities'"),
])
def test_a_bad_or_unsupported_chat_field_is_a_400_naming_it_before_the_engine_runs(tmp_path, tool_tokenizer, fields,
                                                                                 message):
    engine = ScriptedEngine(tool_tokenizer, [])
    seen = {}

    async def agent(session):
        body = json.dumps({"model": session.model, "messages": MESSAGES, **fields}).encode()
        seen["answer"] = await asyncio.to_thread(http, session.base_url + "/chat/completions", body)
        return 1.0

    with pytest.raises(Exception, match="made no model call"):
        run_agent(tmp_path, agent, tool_tokenizer, engine)
    status, body = seen["answer"]
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    assert message in body["error"]["message"] and "\n" not in body["error"]["message"]
    assert engine.seen == []


@pytest.mark.parametrize(("fields", "message"), [
    ({"echo": True}, "'echo' is not supported"),
    ({"echo": "y"}, "'echo' must be true or false"),
    ({"suffix": "end"}, "'suffix' is not supported"),
    ({"best_of": 3}, "'best_of' 3 is not supported"),
    ({"logprobs": True}, "'logprobs' must be an integer from 0 to 5"),
    ({"max_tokens": -1}, "'max_tokens' must be an integer >= 1"),
    ({"stop": {"a": 1}}, "'stop' must be a non-empty string"),
    ({"prompt": {"text": "x"}}, "'prompt' must be one string or one non-empty list of token ids"),
])
def test_a_bad_or_unsupported_completions_field_is_a_400_naming_it(tmp_path, tool_tokenizer, fields, message):
    seen = {}

    async def agent(session):
        body = json.dumps({"model": session.model, "prompt": "1+1=", **fields}).encode()
        seen["answer"] = await asyncio.to_thread(http, session.base_url + "/completions", body)
        return 1.0

    with pytest.raises(Exception, match="made no model call"):
        run_agent(tmp_path, agent, tool_tokenizer, ScriptedEngine(tool_tokenizer, []))
    assert seen["answer"][0] == 400 and message in seen["answer"][1]["error"]["message"]


def test_unknown_fields_are_ignored_and_known_harmless_ones_accepted(tmp_path, tool_tokenizer):
    engine = ScriptedEngine(tool_tokenizer, ["a<eos>"])

    async def agent(session):
        reply = await client_of(session).chat.completions.create(
            model=session.model, messages=session.messages, temperature=0.3, top_p=0.9, seed=4, user="u",
            response_format={"type": "text"}, parallel_tool_calls=True, tools=[CALCULATOR], logit_bias={},
            extra_body={"some_vendor_field": {"x": 1}, "store": False, "metadata": {"k": "v"}})
        return float(reply.choices[0].message.content == "a")

    out = run_agent(tmp_path, agent, tool_tokenizer, engine)
    assert out.metadata["agent_reward"] == 1.0
    assert engine.seen[0][1].temperature == 1.0 and engine.seen[0][1].top_p == 1.0, "the run's sampling applies"


# ---------------------------------------------------------------------------------- --agent-max-calls
@pytest.mark.timeout(60)
def test_agent_max_calls_refuses_the_call_past_the_cap_and_keeps_the_samples(tmp_path, tool_tokenizer):
    engine = ScriptedEngine(tool_tokenizer, ["a<eos>", "b<eos>", "c<eos>"])
    seen = {}

    async def agent(session):
        client = AsyncOpenAI(base_url=session.base_url, api_key=session.api_key)  # the client's default retries
        for number in range(5):
            await client.chat.completions.create(model=session.model, messages=[
                {"role": "user", "content": f"q{number}"}], n=1 if number < 1 else 2 if number < 2 else 1)
            seen["made"] = number + 1

    from openai import AsyncOpenAI

    outs = run_agent(tmp_path, agent, tool_tokenizer, engine, agent_max_calls=3)
    assert seen["made"] == 2 and len(engine.seen) == 3, "the third request (one call past the cap) is refused"
    assert isinstance(outs, list) and len(outs) == 3, "the calls made before the cap are kept as samples"
    assert all(o.metadata["agent_reward"] == 0.0 for o in outs), "an agent that fails at the cap scores 0"
    assert "the cap is 3 (--agent-max-calls 3)" in outs[0].metadata["agent_error"]
    assert "RateLimitError" in outs[0].metadata["agent_error"]
    metrics = outs[0].metadata["rollout_metrics"]
    assert metrics["agent/max_calls_fraction"] == 1.0 and metrics["agent/calls_mean"] == 3.0


def test_an_agent_that_handles_the_cap_keeps_its_reward_and_is_counted(tmp_path, tool_tokenizer):
    engine = ScriptedEngine(tool_tokenizer, ["a<eos>"])
    seen = {}

    async def agent(session):
        client = client_of(session)
        await client.chat.completions.create(model=session.model, messages=session.messages)
        body = json.dumps({"model": session.model, "messages": MESSAGES}).encode()
        seen["raw"] = await asyncio.to_thread(http, session.base_url + "/chat/completions", body)
        with pytest.raises(openai.RateLimitError):
            await client.chat.completions.create(model=session.model, messages=session.messages)
        return 0.5

    out = run_agent(tmp_path, agent, tool_tokenizer, engine, agent_max_calls=1)
    assert seen["raw"][0] == 429 and "--agent-max-calls 1" in seen["raw"][1]["error"]["message"]
    assert out.metadata["agent_reward"] == 0.5 and "agent_error" not in out.metadata
    assert out.metadata["rollout_metrics"]["agent/max_calls_fraction"] == 1.0
    assert out.metadata["rollout_metrics"]["agent/errors_fraction"] == 0.0


def test_a_session_under_the_cap_is_not_counted(tmp_path, tool_tokenizer):
    async def agent(session):
        await client_of(session).chat.completions.create(model=session.model, messages=session.messages)
        return 1.0

    out = run_agent(tmp_path, agent, tool_tokenizer, ScriptedEngine(tool_tokenizer, ["a<eos>"]), agent_max_calls=1)
    assert out.metadata["rollout_metrics"]["agent/max_calls_fraction"] == 0.0


# ---------------------------------------------------------------------------------- reasoning_content
@pytest.mark.parametrize("stream", [False, True])
def test_a_reasoning_parser_gives_reasoning_content_and_the_record_keeps_every_token(tmp_path, tool_tokenizer,
                                                                                    stream):
    think = "<think>two times three</think>"
    engine = ScriptedEngine(tool_tokenizer, [think + "it is 6<eos>", think + TOOL_REPLY])
    seen = []

    async def agent(session):
        client = client_of(session)
        for tools in (None, [CALCULATOR]):
            extra = {"tools": tools} if tools else {}
            if stream:
                chunks = [c async for c in await client.chat.completions.create(
                    model=session.model, messages=session.messages, stream=True, **extra)]
                deltas = [c.choices[0].delta for c in chunks if c.choices]
                seen.append(("".join(getattr(d, "reasoning_content", None) or "" for d in deltas),
                             "".join(d.content or "" for d in deltas) or None,
                             [t.function.name for d in deltas for t in (d.tool_calls or [])]))
            else:
                message = (await client.chat.completions.create(model=session.model, messages=session.messages,
                                                                **extra)).choices[0].message
                seen.append((message.reasoning_content, message.content,
                             [t.function.name for t in message.tool_calls or []]))
        return 1.0

    outs = run_agent(tmp_path, agent, tool_tokenizer, engine, reasoning_parser="qwen3")
    assert seen == [("two times three", "it is 6", []), ("two times three", None, ["calculator"])]
    assert [o.response_tokens for o in outs] == engine.replies, "the reasoning stays in the trained tokens"


def test_responses_put_the_reasoning_in_a_reasoning_item(tmp_path, tool_tokenizer):
    engine = ScriptedEngine(tool_tokenizer, ["<think>easy</think>it is 6<eos>"])
    seen = {}

    async def agent(session):
        reply = await client_of(session).responses.create(model=session.model, input="what is 2*3")
        seen["output"] = [(item.type, getattr(item, "content", None)) for item in reply.output]
        seen["text"] = reply.output_text
        return 1.0

    run_agent(tmp_path, agent, tool_tokenizer, engine, reasoning_parser="qwen3")
    assert seen["output"][0][0] == "reasoning" and seen["output"][0][1][0].text == "easy"
    assert seen["output"][1][0] == "message" and seen["text"] == "it is 6"
