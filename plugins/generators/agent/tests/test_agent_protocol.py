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


def run_agent(tmp_path, func, tokenizer, engine, prompt="what is 2*3", label="6", params=PARAMS, **options):
    """One rollout of ``func`` (an async agent function of the session) on the sample ``prompt``
    (label ``label``) with sampling ``params``; ``options`` are the run's options."""
    config = make_config(plasmid_agent.plugin, run_dir=tmp_path / "run", generate="agent",
                         agent=f"{AGENTS}:answer", **options)
    generate: AgentGenerate = build("generate", "agent", plasmid_agent.plugin, config=config)
    generate.func = func
    sample = Sample(prompt=prompt, tokens=tokenizer(prompt)["input_ids"], label=label, index=1)

    async def main():
        try:
            return await generate(make_ctx(tokenizer, engine), sample, params)
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
    assert out.loss_mask == [] and out.rollout_logprobs == [], "consistent: an empty response"
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
        await client_of(session).chat.completions.create(model=session.model, messages=session.messages,
                                                         tools=[CALCULATOR], tool_choice="required")

    with pytest.raises(ProviderError, match=r"raised BadRequestError.*the gateway's last error: 'tool_choice' "
                                            r"required is not supported"):
        run_agent(tmp_path, agent, tool_tokenizer, ScriptedEngine(tool_tokenizer, []))


def test_a_sync_agent_runs_in_a_thread_with_the_sync_client(tmp_path, tool_tokenizer):
    engine = ScriptedEngine(tool_tokenizer, ["6<eos>"])

    def agent(session):
        client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
        reply = client.chat.completions.create(model=session.model, messages=session.messages)
        return float(reply.choices[0].message.content == session.label)

    out = run_agent(tmp_path, agent, tool_tokenizer, engine)
    assert out.metadata["agent_reward"] == 1.0


# ---------------------------------------------------------------------------------- --agent-errors zero
@pytest.mark.parametrize(("agent_body", "reason"), [
    ("raise RuntimeError('boom')", "raised RuntimeError: boom"),
    ("return 'high'", "returned str 'high'"),
    ("return 1.0", "made no model call through the gateway"),
])
def test_agent_errors_zero_gives_a_failed_agent_reward_zero_and_counts_it(tmp_path, tool_tokenizer, agent_body,
                                                                        reason, capsys):
    namespace = {}
    exec(f"async def agent(session):\n    {agent_body}", namespace)
    prompt_ids = tool_tokenizer("what is 2*3")["input_ids"]
    out = run_agent(tmp_path, namespace["agent"], tool_tokenizer, ScriptedEngine(tool_tokenizer, []),
                    agent_errors="zero")
    assert out.metadata["agent_reward"] == 0.0 and reason in out.metadata["agent_error"]
    assert out.metadata["rollout_metrics"]["agent/errors_fraction"] == 1.0
    assert out.metadata["rollout_metrics"]["agent/calls_mean"] == 0.0
    # nothing to train on: the prompt and one EOS that no loss sees
    assert out.tokens == [*prompt_ids, tool_tokenizer.eos_token_id] and out.prompt_tokens == prompt_ids
    assert out.response_length == 1 and out.loss_mask == [0] and out.rollout_logprobs == [0.0]
    assert out.status == Status.COMPLETED and out.weight_version == ScriptedEngine.weight_version
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and reason in err and "--agent-errors zero" in err


def test_agent_errors_zero_keeps_the_calls_a_failed_agent_made_with_reward_zero(tmp_path, tool_tokenizer):
    engine = ScriptedEngine(tool_tokenizer, ["6<eos>"])

    async def agent(session):
        await client_of(session).chat.completions.create(model=session.model, messages=session.messages)
        raise RuntimeError("parser crashed")

    out = run_agent(tmp_path, agent, tool_tokenizer, engine, agent_errors="zero")
    six = tool_tokenizer.encode("6<eos>", add_special_tokens=False)
    assert out.response_tokens == six and out.loss_mask == [1] * len(six)
    assert out.metadata["agent_reward"] == 0.0 and "parser crashed" in out.metadata["agent_error"]
    assert out.metadata["rollout_metrics"]["agent/errors_fraction"] == 1.0


def test_every_session_reports_its_calls_tokens_samples_branches_and_seconds(tmp_path, tool_tokenizer):
    """Two calls that continue each other, then one that branches from the first: 2 samples, 1 branch."""
    engine = ScriptedEngine(tool_tokenizer, ["a<eos>", "b<eos>", "c<eos>"])

    async def agent(session):
        client = client_of(session)
        first = await client.chat.completions.create(model=session.model, messages=session.messages)
        reply = {"role": "assistant", "content": first.choices[0].message.content}
        await client.chat.completions.create(model=session.model, messages=[
            *session.messages, reply, {"role": "user", "content": "more"}])
        await client.chat.completions.create(model=session.model, messages=[
            *session.messages, reply, {"role": "user", "content": "other"}])
        await asyncio.sleep(0.05)
        return 1.0

    outs = run_agent(tmp_path, agent, tool_tokenizer, engine)
    assert len(outs) == 2
    prompts = [ids for ids, _ in engine.seen]
    metrics = outs[0].metadata["rollout_metrics"]
    assert metrics == outs[1].metadata["rollout_metrics"]
    assert metrics["agent/calls_mean"] == 3.0 and metrics["agent/samples_mean"] == 2.0
    assert metrics["agent/branches_mean"] == 1.0 and metrics["agent/errors_fraction"] == 0.0
    assert metrics["agent/prompt_tokens_mean"] == float(sum(len(p) for p in prompts))
    assert metrics["agent/completion_tokens_mean"] == float(3 * len(tool_tokenizer.encode("a<eos>",
                                                                                         add_special_tokens=False)))
    assert 0.05 <= metrics["agent/seconds_mean"] < 30


# ---------------------------------------------------------------------------------- top_logprobs
def test_top_logprobs_are_checked_and_come_back_empty_beside_the_exact_sampled_logprobs(tmp_path, tool_tokenizer):
    """The engine protocol gives only the sampled token's log-prob: that one is exact, the top-k lists empty."""
    engine = ScriptedEngine(tool_tokenizer, ["ab<eos>", "c", "d"])
    seen = {}

    async def agent(session):
        client = client_of(session)
        reply = await client.chat.completions.create(model=session.model, messages=session.messages, logprobs=True,
                                                     top_logprobs=3)
        seen["chat"] = reply.choices[0].logprobs.content
        done = await client.completions.create(model=session.model, prompt="x", logprobs=5)
        seen["completion"] = done.choices[0].logprobs
        refusals = []
        for bad in ({"logprobs": True, "top_logprobs": 21}, {"top_logprobs": 2}, {"logprobs": "yes"}):
            with pytest.raises(openai.BadRequestError) as raised:
                await client.chat.completions.create(model=session.model, messages=session.messages, **bad)
            refusals.append(raised.value.message)
        with pytest.raises(openai.BadRequestError) as raised:
            await client.completions.create(model=session.model, prompt="x", logprobs=6)
        refusals.append(raised.value.message)
        seen["refusals"] = refusals
        await client.completions.create(model=session.model, prompt="x", logprobs=0)
        return 1.0

    run_agent(tmp_path, agent, tool_tokenizer, engine)
    assert [(e.token, e.logprob, e.top_logprobs) for e in seen["chat"]] == [
        ("a", -0.01, []), ("b", -0.02, []), ("<eos>", pytest.approx(-0.03), [])]
    assert seen["completion"].token_logprobs == [-0.02] and seen["completion"].top_logprobs == [{}]
    assert ["from 0 to 20, got 21" in seen["refusals"][0], "needs 'logprobs': true" in seen["refusals"][1],
            "must be true or false" in seen["refusals"][2], "from 0 to 5, got 6" in seen["refusals"][3]] == [True] * 4
    assert len(engine.seen) == 3, "a refused request never reaches the engine"


@pytest.mark.timeout(120)
def test_with_agent_errors_zero_a_step_of_the_rollout_driver_goes_on_past_failing_agents(tmp_path, tool_tokenizer):
    """Half the agents fail: the step still returns every group, the failed sessions' samples with
    reward 0, and ``rollout/agent/errors_fraction`` counts them."""
    import plasmid_rollout.plugin
    from plasmid_agent.reward import AgentReward

    from plasmid.context import RolloutContext
    from plasmid.rewards import RewardComponent, RewardSet
    from plasmid.session import instantiate
    from plasmid.testing import make_registry
    from plasmid.testing.scripted import Reply
    from plasmid.testing.scripted import ScriptedEngine as Replies
    from plasmid.types import Group

    six = tool_tokenizer.encode("6<eos>", add_special_tokens=False)
    plugins = (plasmid_agent.plugin, plasmid_rollout.plugin)
    config = make_config(*plugins, run_dir=tmp_path / "run", generate="agent", agent=f"{AGENTS}:answer",
                         agent_errors="zero", prompts_per_step=4, n_samples_per_prompt=1)
    generate = instantiate(make_registry(*plugins).get("generate", "agent"), config)

    async def agent(session):
        reply = await client_of(session).chat.completions.create(model=session.model, messages=session.messages)
        if session.index % 2:
            raise RuntimeError(f"agent {session.index} crashed")
        return float(reply.choices[0].message.content == session.label)

    generate.func = agent

    class Source:
        def get_groups(self, n):
            return [Group([Sample(prompt="what is 2*3", tokens=tool_tokenizer("what is 2*3")["input_ids"], label="6",
                                  index=i, group_index=i)], i) for i in range(n)]

        def add_groups(self, groups):
            raise AssertionError("nothing is aborted")

    ctx = RolloutContext(config=config, engines=[Replies(lambda ids, params: Reply(six))], data_source=Source(),
                         tokenizer=tool_tokenizer, generate=generate,
                         rewards=RewardSet([RewardComponent("agent", 1.0, AgentReward(config))]),
                         sampling=SamplingParams(max_new_tokens=20, stop_token_ids=(tool_tokenizer.eos_token_id,)))
    driver = instantiate(make_registry(*plugins).get("rollout", "rollout"), config)

    async def step():
        try:
            return await driver.run(ctx, 0)
        finally:
            await generate.shutdown()

    batch = asyncio.run(step())
    assert [s.reward for s in batch.samples] == [1.0, 0.0, 1.0, 0.0]
    assert ["crashed" in s.metadata.get("agent_error", "") for s in batch.samples] == [False, True, False, True]
    assert batch.metrics["rollout/agent/errors_fraction"] == 0.5 and batch.metrics["rollout/agent/calls_mean"] == 1.0
    assert batch.metrics["rollout/reward_mean"] == 0.5


@pytest.mark.timeout(60)
def test_the_steps_abort_cancels_an_agent_busy_with_its_own_work_and_refuses_its_calls(tmp_path, tool_tokenizer):
    """The driver sets ``ctx.aborting`` while the agent runs a slow tool of its own: the agent is
    cancelled at once and its sample comes back as its prompt, ``ABORTED``; a call after the abort
    is refused."""
    engine = ScriptedEngine(tool_tokenizer, ["a<eos>", "b<eos>"])
    seen = {"busy": False, "cancelled": False}

    async def agent(session):
        await client_of(session).chat.completions.create(model=session.model, messages=session.messages)
        seen["busy"] = True
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            seen["cancelled"] = True
            raise
        return 1.0

    config = make_config(plasmid_agent.plugin, run_dir=tmp_path / "run", generate="agent", agent=f"{AGENTS}:answer")
    generate: AgentGenerate = build("generate", "agent", plasmid_agent.plugin, config=config)
    generate.func = agent
    prompt_ids = tool_tokenizer("what is 2*3")["input_ids"]

    async def main():
        aborting = asyncio.Event()
        sample = Sample(prompt="what is 2*3", tokens=list(prompt_ids), label="6", index=1)
        task = asyncio.ensure_future(generate(make_ctx(tool_tokenizer, engine, aborting), sample, PARAMS))
        while not seen["busy"]:
            await asyncio.sleep(0.01)
        aborting.set()
        try:
            out = await asyncio.wait_for(task, 10)
            rollout = generate.gateway.open(engine, PARAMS, aborting=aborting)
            refused = generate.gateway.generate(rollout, list(prompt_ids), "")
            with pytest.raises(Exception, match="plasmid aborted this rollout"):
                await refused
            return out
        finally:
            await generate.shutdown()

    out = asyncio.run(main())
    assert seen["cancelled"] and len(engine.seen) == 1
    assert out.status == Status.ABORTED and out.tokens == prompt_ids and out.response_length == 0
    assert "agent_reward" not in out.metadata and "rollout_metrics" not in out.metadata


def test_a_call_past_the_models_context_is_refused_with_400_as_vllm_refuses_it(tmp_path, tool_tokenizer):
    model = tmp_path / "model"  # the gateway reads the context from --model's config.json
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 40}))
    engine = ScriptedEngine(tool_tokenizer, ["it is 6<eos>"])
    seen = {}

    async def agent(session):
        client = client_of(session)
        reply = await client.chat.completions.create(model=session.model, messages=session.messages, max_tokens=10)
        seen["prompt"] = reply.usage.prompt_tokens
        body = json.dumps({"model": session.model, "messages": session.messages}).encode()
        seen["refused"] = await asyncio.to_thread(http, session.base_url + "/chat/completions", body)
        with pytest.raises(openai.BadRequestError, match="This model's maximum context length is 40 tokens"):
            await client.completions.create(model=session.model, prompt=list(range(3, 10)) * 6, max_tokens=1)
        return 1.0

    out = run_agent(tmp_path, agent, tool_tokenizer, engine, model=str(model))
    prompt = seen["prompt"]
    status, body = seen["refused"]
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"] == (
        f"This model's maximum context length is 40 tokens. However, you requested {prompt + 200} tokens ({prompt} "
        f"in the messages, 200 in the completion). Please reduce the length of the messages or completion.")
    assert len(engine.seen) == 1, "the refused calls never reached the engine"
    assert out.response_length == len(engine.replies[0])


def test_an_engines_context_refusal_is_a_400_too(tmp_path, tool_tokenizer):
    from plasmid.errors import ContextLengthError

    class ShortEngine(ScriptedEngine):
        async def generate(self, prompt_ids, params):
            raise ContextLengthError(16, len(prompt_ids), params.max_new_tokens, where="engine 'short'")

    async def agent(session):
        with pytest.raises(openai.BadRequestError, match=r"maximum context length is 16 tokens\. However, you "
                                                         r"requested \d+ tokens \(\d+ in the messages, 5 in the"):
            await client_of(session).chat.completions.create(model=session.model, messages=session.messages,
                                                             max_tokens=5)
        raise RuntimeError("no call fit")

    with pytest.raises(ProviderError, match="the gateway's last error: This model's maximum context length is 16"):
        run_agent(tmp_path, agent, tool_tokenizer, ShortEngine(tool_tokenizer, []))
