"""Multi-turn tool rollouts (``--generate multiturn``) and the agent gateway (``--generate agent``)
with ``--engine vllm``, on the session's real vLLM server: every sample is exactly the engine's
token ids plus the environment's (tool answers, chat-template turns), loss-masked and with the
engine's log-probs (``plasmid.testing.conversation.check_token_in_token_out``, the same check as
for any engine), and those log-probs are what the server scores for the sample's tokens.

The session's model is a random tiny Qwen2 with 16 ids, which never spells a JSON tool call. So the
multi-turn test's tokenizer makes one id a whole ``<tool_call>...</tool_call>``: the id the model
picks greedily after the prompt (asked of the server first), so that the greedy sample calls the
tool in its first turn, for certain, and the turn is cut right after it.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from plasmid.context import RolloutContext
from plasmid.testing import build, make_config, run
from plasmid.testing.conversation import RecordingEngine, check_token_in_token_out
from plasmid.types import Sample, SamplingParams, Status

plasmid_multiturn_plugin = pytest.importorskip("plasmid_multiturn.plugin")
plasmid_agent_plugin = pytest.importorskip("plasmid_agent.plugin")

BOS, EOS = 1, 2
PROMPTS = ([1, 6, 13, 7, 14], [1, 9, 13, 4, 14], [1, 3, 14], [1, 12, 12, 14])  # "3+4=", "6+1=", "0=", "99="
CALL = "<tool_call>" + json.dumps({"name": "probe", "arguments": {}}) + "</tool_call>"
OPEN, CLOSE = "<tool_response>", "</tool_response>"
LOGPROB_BOUND = 1e-4  # generate and score both compute in float32 on the same server


class CallTokenizer:
    """The session model's 16 ids as text: ``<pad>`` ``<bos>`` ``<eos>``, ``call_id`` one whole
    tool call, then ``<tool_response>``, ``</tool_response>`` and the ten digits on the other ids.
    Encoding anything else raises (multiturn then keeps only the characters it can spell)."""

    def __init__(self, call_id: int) -> None:
        others = [i for i in range(3, 16) if i != call_id]
        self.texts = {0: "<pad>", BOS: "<bos>", EOS: "<eos>", call_id: CALL, others[0]: OPEN, others[1]: CLOSE,
                      **{others[2 + d]: str(d) for d in range(10)}}
        self.ids = {text: i for i, text in self.texts.items()}
        self.eos_token_id = EOS

    def encode(self, text, add_special_tokens=True):
        ids, position = ([BOS] if add_special_tokens else []), 0
        while position < len(text):
            piece = next((t for t in sorted(self.ids, key=len, reverse=True) if text.startswith(t, position)), None)
            if piece is None:
                raise ValueError(f"CallTokenizer cannot spell {text[position]!r}")
            ids.append(self.ids[piece])
            position += len(piece)
        return ids

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.texts[i] for i in ids if not (skip_special_tokens and i in (0, BOS, EOS)))


class Probe:
    """The tool the call calls: answers ``42``, counting its calls."""

    name, description, parameters = "probe", "answers 42", {"type": "object", "properties": {}}

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, arguments, sample):
        self.calls += 1
        return "42"


def greedy_first_token(engine) -> tuple[list[int], int]:
    """A prompt of ``PROMPTS`` after which the model's greedy first id is not a special one, and that id."""
    for prompt in PROMPTS:
        output = run(engine.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=1)))
        if output.token_ids[0] >= 3:
            return prompt, output.token_ids[0]
    raise AssertionError("the model's greedy first id is <pad>, <bos> or <eos> after every test prompt")


def assert_engine_logprobs(engine, sample: Sample) -> None:
    """The sample's log-probs of its model tokens are what the server scores for them in context (at temperature 1,
    as greedy requests report them); the environment's tokens carry 0.0."""
    prompt_length = len(sample.tokens) - sample.response_length
    scored = run(engine.score(sample.tokens, prompt_length, 1.0))
    for position, (mask, logprob, score) in enumerate(zip(sample.loss_mask, sample.rollout_logprobs, scored,
                                                          strict=True)):
        if mask:
            assert abs(logprob - score) <= LOGPROB_BOUND, f"response token {position}: {logprob} vs scored {score}"
        else:
            assert logprob == 0.0


@pytest.mark.timeout(300)
def test_multiturn_tool_rollouts_on_vllm_are_the_engines_tokens_and_the_tools_answers(engine):
    prompt, call_id = greedy_first_token(engine)
    tokenizer, tool = CallTokenizer(call_id), Probe()
    config = make_config(plasmid_multiturn_plugin, generate="multiturn", max_turns=3, max_response_tokens=200)
    generate = build("generate", "multiturn", plasmid_multiturn_plugin, config=config)
    answer = tokenizer.encode(OPEN + "42" + CLOSE, add_special_tokens=False)
    requests = [SamplingParams(temperature=0.0, max_new_tokens=8, stop_token_ids=(EOS,), seed=5)]
    requests += [SamplingParams(temperature=1.0, max_new_tokens=8, stop_token_ids=(EOS,), seed=seed)
                 for seed in range(100, 106)]

    async def rollouts():
        recorders = [RecordingEngine(engine) for _ in requests]

        async def one(recorder, params):
            ctx = RolloutContext(config=config, engines=[recorder], data_source=None, tokenizer=tokenizer,
                                 generate=generate, rewards=None, tools={tool.name: tool})
            return await generate(ctx, Sample(prompt="q", tokens=list(prompt)), params)

        return recorders, await asyncio.gather(*(one(r, p) for r, p in zip(recorders, requests, strict=True)))

    recorders, samples = run(rollouts())

    def kept_of(output):
        """A turn is cut right after its last call (every call of a turn runs, in order)."""
        ids = output.token_ids
        return len(ids) - ids[::-1].index(call_id) if call_id in ids else None

    ran = sum(r.calls[i].output.token_ids[:kept_of(r.calls[i].output)].count(call_id)
              for r in recorders for i in range(len(r.calls) - 1))
    assert ran == tool.calls, "every call of every turn but the last ran the tool once"
    for recorder, sample, params in zip(recorders, samples, requests, strict=True):
        calls = recorder.calls
        kept = [kept_of(c.output) for c in calls]
        assert all(k is not None for k in kept[:-1]), "every turn but the last holds a call"
        answers = [answer * c.output.token_ids[:k].count(call_id) for c, k in zip(calls[:-1], kept, strict=False)]
        check_token_in_token_out(sample, calls, environment=answers, kept=kept)
        assert [c.params.seed for c in calls] == [params.seed + turn for turn in range(len(calls))]
        assert all(c.params.temperature == params.temperature for c in calls)
        assert sample.status == (Status.TRUNCATED if kept[-1] is not None else calls[-1].output.status)
        assert sample.metadata["rollout_metrics"]["turns_mean"] == len(calls)
        assert sample.weight_version == engine.weight_version
        assert_engine_logprobs(engine, sample)
    greedy = recorders[0].calls
    assert len(greedy) >= 2 and greedy[0].output.token_ids[0] == call_id, "the greedy sample calls in its first turn"
    first = greedy[0].output.token_ids[:kept_of(greedy[0].output)]
    calls_made = first.count(call_id)
    assert samples[0].response_tokens[:len(first) + calls_made * len(answer)] == [*first, *answer * calls_made]


@pytest.mark.timeout(300)
def test_the_agent_gateway_on_vllm_records_the_engines_exact_tokens_and_logprobs(engine, tiny_qwen, tmp_path):
    from plasmid_torch.hf import load_tokenizer

    tokenizer = load_tokenizer(str(tiny_qwen))
    # the agent plugin's own two-turn test agent (loaded by path, as --agent loads any agent file)
    agent = Path(__file__).parents[2] / "agent" / "tests" / "agents.py"
    config = make_config(plasmid_agent_plugin, run_dir=tmp_path / "run", generate="agent", agent=f"{agent}:two_turns")
    generate = build("generate", "agent", plasmid_agent_plugin, config=config)
    seen = []
    original = generate.func

    async def spy(session):
        seen.append(session)
        return await original(session)

    generate.func = spy
    sample = Sample(prompt="3+4=", tokens=tokenizer("3+4=")["input_ids"], label="7", index=5, group_index=2)
    params = SamplingParams(temperature=1.0, max_new_tokens=8, stop_token_ids=(EOS,), seed=11)

    async def main():
        recorder = RecordingEngine(engine)
        ctx = RolloutContext(config=config, engines=[recorder], data_source=None, tokenizer=tokenizer,
                             generate=generate, rewards=None)
        try:
            return recorder, await generate(ctx, sample, params)
        finally:
            await generate.shutdown()

    recorder, out = run(main())
    assert isinstance(out, Sample), "a conversation whose second prompt extends the first is one sample"
    first, second = recorder.calls
    assert first.prompt_ids == sample.tokens, "one user message renders to exactly the prompt's ids"
    assert first.params.max_new_tokens == 3 and first.params.seed != second.params.seed
    between = ([] if first.output.token_ids[-1:] == [EOS] else [EOS]) + tokenizer("1+1=")["input_ids"]
    check_token_in_token_out(out, recorder.calls, environment=[between])
    assert out.weight_version == engine.weight_version and out.index == 5 and out.label == "7"
    assert_engine_logprobs(engine, out)
    # what the client saw: the engine's log-probs, plain and streamed
    plain, chunks = seen[0].metadata["replies"]
    assert [entry.logprob for entry in plain.choices[0].logprobs.content] == first.output.logprobs
    streamed = [entry.logprob for c in chunks if c.choices and c.choices[0].logprobs
                for entry in c.choices[0].logprobs.content]
    assert streamed == second.output.logprobs
