"""The gateway on the quickstart's tiny model (torchgen, CPU), driven by the real ``openai`` client:
the recorded sample holds exactly the engine's token ids and log-probs, the client sees them too."""

from __future__ import annotations

import asyncio
from pathlib import Path

import plasmid_agent.plugin
import plasmid_torchgen.plugin
import pytest
from conftest import RecordingEngine, make_ctx
from plasmid_agent.generate import AgentGenerate

from plasmid.testing import build, make_config
from plasmid.testing.conversation import EngineCall, check_token_in_token_out
from plasmid.types import Sample, SamplingParams, Status
from plasmid_torch.hf import load_tokenizer

AGENTS = Path(__file__).parent / "agents.py"


def agent_generate(tmp_path, func: str, **options) -> AgentGenerate:
    config = make_config(plasmid_agent.plugin, run_dir=tmp_path / "run", generate="agent",
                         agent=f"{AGENTS}:{func}", **options)
    return build("generate", "agent", plasmid_agent.plugin, config=config)


@pytest.mark.timeout(120)
def test_two_turns_through_the_openai_client_are_one_sample_of_the_engines_exact_tokens(tmp_path, tiny_model):
    tokenizer = load_tokenizer(str(tiny_model))
    engine_config = make_config(plasmid_torchgen.plugin, run_dir=tmp_path / "run", model=str(tiny_model))
    generate = agent_generate(tmp_path, "two_turns")
    prompt = "3+4="
    sample = Sample(prompt=prompt, tokens=tokenizer(prompt)["input_ids"], label="7", index=5, group_index=2)
    params = SamplingParams(temperature=1.0, max_new_tokens=8, stop_token_ids=(2,), seed=11)

    async def main():
        engine = RecordingEngine(build("engine", "torchgen", plasmid_torchgen.plugin, config=engine_config))
        try:
            return engine, await generate(make_ctx(tokenizer, engine), sample, params)
        finally:
            await generate.shutdown()
            await engine.engine.shutdown()

    engine, out = asyncio.run(main())
    assert isinstance(out, Sample), "a conversation whose second prompt extends the first is one sample"
    (prompt1, params1, out1), (prompt2, params2, out2) = engine.seen
    assert prompt1 == sample.tokens, "one user message renders to exactly the quickstart's prompt ids"
    assert params1.max_new_tokens == 3 and params1.temperature == 1.0 and params1.seed != params2.seed
    assert prompt2[:len(prompt1) + len(out1.token_ids)] == prompt1 + out1.token_ids, "the model's ids are reused"
    between = prompt2[len(prompt1) + len(out1.token_ids):]
    assert tokenizer.decode(between) == ("" if out1.token_ids[-1:] == [2] else "<eos>") + "<bos>1+1="
    check_token_in_token_out(out, [EngineCall(*seen) for seen in engine.seen], environment=[between])
    assert out.status == out2.status and out.weight_version == 0
    assert out.index == 5 and out.group_index == 2 and out.label == "7"
    assert out.metadata["agent_reward"]["calls"] == 2.0 and out.metadata["agent_calls"] == 2
    assert "replies" not in out.metadata, "the agent's session metadata is a copy, not the sample's"


def spied(generate):
    """``(generate, sessions)``: ``generate`` with its agent wrapped to keep every session it ran."""
    sessions = []
    original = generate.func

    async def spy(session):
        sessions.append(session)
        return await original(session)

    generate.func = spy
    return generate, sessions


def run_on_torchgen(generate, tokenizer, engine_config, sample, params):
    """``(recording engine, sample)``: ``sample`` through ``generate`` on a real torchgen engine."""

    async def main():
        engine = RecordingEngine(build("engine", "torchgen", plasmid_torchgen.plugin, config=engine_config))
        try:
            return engine, await generate(make_ctx(tokenizer, engine), sample, params)
        finally:
            await generate.shutdown()
            await engine.engine.shutdown()

    return asyncio.run(main())


@pytest.mark.timeout(120)
def test_the_client_sees_the_engines_logprobs_plain_and_streamed(tmp_path, tiny_model):
    tokenizer = load_tokenizer(str(tiny_model))
    engine_config = make_config(plasmid_torchgen.plugin, run_dir=tmp_path / "run", model=str(tiny_model))
    generate, seen_sessions = spied(agent_generate(tmp_path, "two_turns"))
    sample = Sample(prompt="5+5=", tokens=tokenizer("5+5=")["input_ids"], label="0")
    params = SamplingParams(temperature=1.0, max_new_tokens=8, stop_token_ids=(2,), seed=3)
    engine, _ = run_on_torchgen(generate, tokenizer, engine_config, sample, params)
    first, chunks = seen_sessions[0].metadata["replies"]
    (_, _, out1), (_, _, out2) = engine.seen
    assert [entry.logprob for entry in first.choices[0].logprobs.content] == out1.logprobs
    assert first.choices[0].message.content == tokenizer.decode(out1.token_ids, skip_special_tokens=True)
    assert first.choices[0].finish_reason == ("stop" if out1.status == Status.COMPLETED else "length")
    assert first.usage.completion_tokens == len(out1.token_ids)
    streamed = [entry.logprob for c in chunks if c.choices and c.choices[0].logprobs
                for entry in c.choices[0].logprobs.content]
    assert streamed == out2.logprobs
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        tokenizer.decode(out2.token_ids, skip_special_tokens=True)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


@pytest.mark.timeout(120)
def test_stop_strings_reach_torchgen_which_stops_on_them_and_nothing_is_generated_past_the_stop(tmp_path, tiny_model):
    tokenizer = load_tokenizer(str(tiny_model))
    engine_config = make_config(plasmid_torchgen.plugin, run_dir=tmp_path / "run", model=str(tiny_model))
    generate, sessions = spied(agent_generate(tmp_path, "stop_on_digits"))
    sample = Sample(prompt="8+9=", tokens=tokenizer("8+9=")["input_ids"], label="17")
    params = SamplingParams(temperature=1.0, max_new_tokens=32, stop_token_ids=(2,), seed=5)
    engine, out = run_on_torchgen(generate, tokenizer, engine_config, sample, params)
    ((prompt, sent, output),) = engine.seen
    assert sent.stop == ("1", "23", "=>") and sent.max_new_tokens == 24, "the request's stop went to the engine"
    text = tokenizer.decode(output.token_ids, skip_special_tokens=True)
    stop = next(s for s in sent.stop if text.endswith(s))
    assert output.status == Status.COMPLETED and not any(s in text[:-1] for s in sent.stop), \
        "the engine itself ended the response on the token that completed the first stop string"
    reply = sessions[0].metadata["reply"]
    assert reply.choices[0].message.content == text[:-len(stop)] and reply.choices[0].finish_reason == "stop"
    check_token_in_token_out(out, [EngineCall(prompt, sent, output)], environment=[])  # every engine token kept
