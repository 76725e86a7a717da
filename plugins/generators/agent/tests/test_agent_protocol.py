"""The gateway's OpenAI protocol and token accounting with a scripted engine: tool calls, branches,
completions, session keys, aborts and agent failures."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from pathlib import Path

import openai
import plasmid_agent.plugin
import pytest
from conftest import ScriptedEngine, make_ctx
from openai import AsyncOpenAI
from plasmid_agent.generate import AgentGenerate

from plasmid.errors import ProviderError
from plasmid.testing import build, make_config
from plasmid.types import Sample, SamplingParams, Status

AGENTS = Path(__file__).parent / "agents.py"
PARAMS = SamplingParams(temperature=1.0, max_new_tokens=200, stop_token_ids=(2,), seed=7)
CALCULATOR = {"type": "function", "function": {"name": "calculator", "description": "evaluate",
                                               "parameters": {"type": "object", "properties": {
                                                   "expression": {"type": "string"}}}}}
TOOL_REPLY = '<tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call><eos>'


def run_agent(tmp_path, func, tokenizer, engine, prompt="what is 2*3", **options):
    config = make_config(plasmid_agent.plugin, run_dir=tmp_path / "run", generate="agent",
                         agent=f"{AGENTS}:answer", **options)
    generate: AgentGenerate = build("generate", "agent", plasmid_agent.plugin, config=config)
    generate.func = func
    sample = Sample(prompt=prompt, tokens=tokenizer(prompt)["input_ids"], label="6", index=1)

    async def main():
        try:
            return await generate(make_ctx(tokenizer, engine), sample, PARAMS)
        finally:
            await generate.shutdown()

    return asyncio.run(main())


def http(url, body=None):
    """``(status, JSON body)`` of a plain GET (or POST of ``body``) with the standard library."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def client_of(session):
    return AsyncOpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_come_back_in_openai_format_and_the_tool_turn_is_masked(tmp_path, tool_tokenizer, stream):
    engine = ScriptedEngine(tool_tokenizer, [TOOL_REPLY, "it is 6<eos>"])
    seen = {}

    async def agent(session):
        client = client_of(session)
        messages = list(session.messages)
        if stream:
            chunks = [c async for c in await client.chat.completions.create(
                model=session.model, messages=messages, tools=[CALCULATOR], stream=True)]
            calls = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
            seen["finish"] = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
            call_id, name, arguments = calls[0].id, calls[0].function.name, calls[0].function.arguments
        else:
            reply = await client.chat.completions.create(model=session.model, messages=messages, tools=[CALCULATOR])
            seen["finish"] = reply.choices[0].finish_reason
            seen["content"] = reply.choices[0].message.content
            call = reply.choices[0].message.tool_calls[0]
            call_id, name, arguments = call.id, call.function.name, call.function.arguments
        seen["call"] = (name, json.loads(arguments))
        messages += [{"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": call_id, "content": "6"}]
        final = await client.chat.completions.create(model=session.model, messages=messages, tools=[CALCULATOR])
        return float(final.choices[0].message.content == "it is 6")

    out = run_agent(tmp_path, agent, tool_tokenizer, engine)
    assert seen["call"] == ("calculator", {"expression": "2*3"}) and seen["finish"] == "tool_calls"
    assert seen.get("content") is None
    assert out.metadata["agent_reward"] == 1.0
    (prompt1, _), (prompt2, _) = engine.seen
    reply1, reply2 = engine.replies
    assert prompt2[:len(prompt1) + len(reply1)] == prompt1 + reply1, "the tool call's ids are reused, not re-rendered"
    tool_turn = prompt2[len(prompt1) + len(reply1):]
    assert tool_tokenizer.decode(tool_turn) == "<tool>6<assistant>"
    assert out.tokens == prompt2 + reply2
    assert out.loss_mask == [1] * len(reply1) + [0] * len(tool_turn) + [1] * len(reply2)
    assert out.rollout_logprobs == ([-0.01 * (i + 1) for i in range(len(reply1))] + [0.0] * len(tool_turn)
                                    + [-0.02 * (i + 1) for i in range(len(reply2))])
    assert out.weight_version == 3 and out.status == Status.COMPLETED


def test_branching_calls_become_separate_samples_of_the_group(tmp_path, tool_tokenizer):
    engine = ScriptedEngine(tool_tokenizer, ["a<eos>", "b<eos>", "c<eos>", "d<eos>"])

    async def agent(session):
        client = client_of(session)
        base = list(session.messages)
        first = await client.chat.completions.create(model=session.model, messages=base)
        history = base + [{"role": "assistant", "content": first.choices[0].message.content}]
        await client.chat.completions.create(model=session.model, messages=history + [{"role": "user", "content": "x"}])
        await client.chat.completions.create(model=session.model, messages=history + [{"role": "user", "content": "y"}])
        await client.chat.completions.create(model=session.model, messages=[{"role": "user", "content": "new"}])
        return {"score": 0.5}

    out = run_agent(tmp_path, agent, tool_tokenizer, engine)
    assert isinstance(out, list) and len(out) == 3
    prompts = [p for p, _ in engine.seen]
    a, b, c, d = engine.replies
    assert out[0].tokens == prompts[1] + b and out[0].prompt_tokens == prompts[0]
    assert out[0].loss_mask == [1] * len(a) + [0] * (len(prompts[1]) - len(prompts[0]) - len(a)) + [1] * len(b)
    assert out[1].tokens == prompts[2] + c
    assert out[1].prompt_tokens == prompts[2], "a branch: its whole prompt is context"
    assert out[1].loss_mask == [1] * len(c)
    assert out[2].tokens == prompts[3] + d and out[2].loss_mask == [1] * len(d)
    assert {s.group_index for s in out} == {0} and all(s.metadata["agent_reward"] == {"score": 0.5} for s in out)


def test_an_edited_history_is_encoded_afresh_as_a_new_sample(tmp_path, tool_tokenizer):
    engine = ScriptedEngine(tool_tokenizer, ["abc<eos>", "d<eos>"])

    async def agent(session):
        client = client_of(session)
        await client.chat.completions.create(model=session.model, messages=session.messages)
        edited = session.messages + [{"role": "assistant", "content": "xyz"}, {"role": "user", "content": "q"}]
        await client.chat.completions.create(model=session.model, messages=edited)
        return 1.0

    out = run_agent(tmp_path, agent, tool_tokenizer, engine)
    assert len(out) == 2
    assert out[1].prompt_tokens == tool_tokenizer.encode("<bos><user>what is 2*3<assistant>xyz<eos><user>q<assistant>",
                                                         add_special_tokens=False)


def test_completions_with_text_and_token_prompts_and_logprobs(tmp_path, tool_tokenizer):
    engine = ScriptedEngine(tool_tokenizer, ["12", "3<eos>", "9"])
    seen = {}

    async def agent(session):
        client = client_of(session)
        first = await client.completions.create(model=session.model, prompt="1+1=", logprobs=1, max_tokens=5)
        seen["first"] = first.choices[0]
        chunks = [c async for c in await client.completions.create(
            model=session.model, prompt="1+1=" + first.choices[0].text + "+", stream=True, logprobs=1)]
        seen["text"] = "".join(c.choices[0].text for c in chunks if c.choices)
        await client.completions.create(model=session.model, prompt=[1, 5, 6])
        return 0.0

    out = run_agent(tmp_path, agent, tool_tokenizer, engine)
    first = seen["first"]
    assert first.text == "12" and first.logprobs.token_logprobs == [-0.01, -0.02]
    assert first.logprobs.tokens == ["1", "2"]
    assert seen["text"] == "3"
    (p1, _), (p2, _), (p3, _) = engine.seen
    assert p1 == tool_tokenizer.encode("1+1=") and p2 == p1 + engine.replies[0] + tool_tokenizer.encode(
        "+", add_special_tokens=False)
    assert p3 == [1, 5, 6]
    assert len(out) == 2 and out[0].loss_mask == [1, 1, 0, 1, 1]


def test_session_keys_keep_concurrent_agents_apart_and_unknown_keys_are_refused(tmp_path, tool_tokenizer):
    engine = ScriptedEngine(tool_tokenizer, ["a<eos>"])
    seen = {}

    async def agent(session):
        plain = AsyncOpenAI(base_url=session.base_url.split("/s/")[0] + "/v1", api_key=session.api_key,
                            max_retries=0)
        await plain.chat.completions.create(model=session.model, messages=session.messages)
        with pytest.raises(openai.AuthenticationError, match="unknown or finished session key"):
            await AsyncOpenAI(base_url=session.base_url.split("/s/")[0] + "/v1", api_key="other",
                              max_retries=0).chat.completions.create(model=session.model, messages=session.messages)
        seen["models"] = await asyncio.to_thread(http, session.base_url + "/models")
        seen["404"] = await asyncio.to_thread(http, session.base_url + "/nothing", b"{}")
        seen["bad"] = await asyncio.to_thread(http, session.base_url + "/chat/completions", b"{not json")
        with pytest.raises(openai.BadRequestError, match="'stop' sequences are not supported"):
            await client_of(session).chat.completions.create(model=session.model, messages=session.messages,
                                                             stop=["x"])
        return 1.0

    out = run_agent(tmp_path, agent, tool_tokenizer, engine)
    assert out.loss_mask == [1, 1] and len(engine.seen) == 1
    assert seen["models"] == (200, {"object": "list", "data": [
        {"id": "plasmid", "object": "model", "created": 0, "owned_by": "plasmid"}]})
    assert seen["404"][0] == 404 and "no route POST /v1/nothing" in seen["404"][1]["error"]["message"]
    assert seen["bad"][0] == 400 and "bad request" in seen["bad"][1]["error"]["message"]


@pytest.mark.timeout(60)
def test_agent_concurrency_bounds_the_agents_running_at_once(tmp_path, tool_tokenizer):
    config = make_config(plasmid_agent.plugin, run_dir=tmp_path / "run", generate="agent",
                         agent=f"{AGENTS}:answer", agent_concurrency=2)
    generate: AgentGenerate = build("generate", "agent", plasmid_agent.plugin, config=config)
    running, peak = 0, 0

    async def agent(session):
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await client_of(session).chat.completions.create(model=session.model, messages=session.messages)
        await asyncio.sleep(0.05)
        running -= 1
        return 1.0

    generate.func = agent
    engine = ScriptedEngine(tool_tokenizer, ["a<eos>"] * 6)

    async def main():
        samples = [Sample(prompt="q", tokens=[1, 3], index=i) for i in range(6)]
        try:
            return await asyncio.gather(*(generate(make_ctx(tool_tokenizer, engine), s, PARAMS) for s in samples))
        finally:
            await generate.shutdown()

    outs = asyncio.run(main())
    assert peak == 2 and len(outs) == 6 and sorted(o.index for o in outs) == list(range(6))


def test_an_aborted_call_gives_the_prompt_back_aborted(tmp_path, tool_tokenizer):
    engine = ScriptedEngine(tool_tokenizer, ["a", "b"], statuses=[Status.COMPLETED, Status.ABORTED])

    async def agent(session):
        client = client_of(session)
        await client.chat.completions.create(model=session.model, messages=session.messages)
        await client.chat.completions.create(model=session.model, messages=session.messages)
        return 1.0

    out = run_agent(tmp_path, agent, tool_tokenizer, engine)
    assert out.status == Status.ABORTED and out.response_length == 0 and out.tokens == out.prompt_tokens
    assert "agent_reward" not in out.metadata


@pytest.mark.parametrize(("agent_body", "message"), [
    ("raise RuntimeError('boom')", r"agent .*agents.py:answer \(--agent\) on sample 1 raised RuntimeError: boom"),
    ("return 'high'", r"on sample 1 returned str 'high'; return the reward"),
    ("return float('nan')", r"returned the non-finite reward nan"),
    ("return 1.0", r"made no model call through the gateway"),
])
def test_a_failing_agent_stops_the_run_naming_the_agent_and_sample(tmp_path, tool_tokenizer, agent_body, message):
    namespace = {}
    exec(f"async def agent(session):\n    {agent_body}", namespace)
    with pytest.raises(ProviderError, match=message):
        run_agent(tmp_path, namespace["agent"], tool_tokenizer, ScriptedEngine(tool_tokenizer, []))


def test_a_refused_request_is_named_when_the_agent_then_fails(tmp_path, tool_tokenizer):
    async def agent(session):
        await client_of(session).chat.completions.create(model=session.model, messages=session.messages, n=2)

    with pytest.raises(ProviderError, match=r"raised BadRequestError.*the gateway's last error: 'n' must be 1"):
        run_agent(tmp_path, agent, tool_tokenizer, ScriptedEngine(tool_tokenizer, []))


def test_a_sync_agent_runs_in_a_thread_with_the_sync_client(tmp_path, tool_tokenizer):
    engine = ScriptedEngine(tool_tokenizer, ["6<eos>"])

    def agent(session):
        client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
        reply = client.chat.completions.create(model=session.model, messages=session.messages)
        return float(reply.choices[0].message.content == session.label)

    out = run_agent(tmp_path, agent, tool_tokenizer, engine)
    assert out.metadata["agent_reward"] == 1.0
