"""``--generate multiturn`` on a scripted engine: the exact token layout, masks and log-probs of a
conversation, tool failures told to the model, the turn and token limits, partial rollouts and
aborts, the ``mistral`` format's several calls per turn, and every parser of ``--tool-parser`` and
``--reasoning-parser``."""

from __future__ import annotations

import asyncio
import json
import re

import plasmid_multiturn.plugin
import pytest
from plasmid_multiturn.formats import Mistral
from plasmid_multiturn.generate import MultiTurn

from plasmid.context import RolloutContext
from plasmid.errors import UsageError
from plasmid.protocols import ToolError
from plasmid.testing import build, make_config
from plasmid.testing.scripted import Reply, ScriptedEngine
from plasmid.types import Sample, SamplingParams, Status
from plasmid_serving.parsers import TOOL_PARSERS, CallSpan, ToolCall, ToolParser

PAD, BOS, EOS = 0, 1, 2


class CharTokenizer:
    """One id per character (``3 + ord``), ``<bos>`` 1 and ``<eos>`` 2; ``specials`` are
    multi-character strings that are one token each (ids from 1000)."""

    def __init__(self, specials: tuple[str, ...] = ()) -> None:
        self.specials = {text: 1000 + i for i, text in enumerate(specials)}
        self.eos_token_id = EOS

    def encode(self, text, add_special_tokens=True):
        ids, position = ([BOS] if add_special_tokens else []), 0
        while position < len(text):
            special = next((s for s in self.specials if text.startswith(s, position)), None)
            if special is not None:
                ids.append(self.specials[special])
                position += len(special)
            else:
                ids.append(3 + ord(text[position]))
                position += 1
        return ids

    def decode(self, ids, skip_special_tokens=False):
        names = {v: k for k, v in self.specials.items()}
        out = []
        for token in ids:
            if token in (PAD, BOS, EOS):
                if not skip_special_tokens:
                    out.append({PAD: "<pad>", BOS: "<bos>", EOS: "<eos>"}[token])
            else:
                out.append(names.get(token) or chr(token - 3))
        return "".join(out)


TOKENIZER = CharTokenizer()


def ids(text: str) -> list[int]:
    return TOKENIZER.encode(text, add_special_tokens=False)


def call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def answer(text: str) -> str:
    return f"<tool_response>{text}</tool_response>"


def logprobs(n: int, start: int) -> list[float]:
    """Distinct log-probs, so that a misplaced one is seen."""
    return [-(start + i) / 1000 for i in range(n)]


class Add:
    name, description = "add", "Add two integers."
    parameters = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                  "required": ["a", "b"]}

    async def __call__(self, arguments, sample):
        if not all(isinstance(arguments.get(k), int) for k in "ab"):
            raise ToolError("a and b must be integers")
        return str(arguments["a"] + arguments["b"])


class Scripted:
    """A tool that does what it is told: answer, raise, hang or flood."""

    description = "test tool"
    parameters = {"type": "object", "properties": {}}

    def __init__(self, name, behaviour):
        self.name, self.behaviour = name, behaviour
        self.calls, self.cancelled = 0, False

    async def __call__(self, arguments, sample):
        self.calls += 1
        if self.behaviour == "raise":
            raise RuntimeError("disk on fire\nsecond line")
        if self.behaviour == "tool-error":
            raise ToolError("no such city")
        if self.behaviour == "hang":
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                self.cancelled = True
                raise
        if self.behaviour == "flood":
            return "x" * 50
        if self.behaviour == "number":
            return 42
        if self.behaviour == "parts":
            return [{"type": "text", "text": "ok"}, {"type": "audio"}]
        if self.behaviour == "image":
            return [{"type": "text", "text": "ok"}, {"type": "image_url", "image_url": {"url": "data:,"}}]
        if self.behaviour == "long-parts":
            return [{"type": "text", "text": "x" * 6}, {"type": "text", "text": "y" * 6}]
        if self.behaviour == "text-parts":
            return [{"type": "text", "text": "o"}, {"type": "text", "text": "k"}]
        return "ok"


def make_context(engine, tools=(), tokenizer=TOKENIZER, **options):
    config = make_config(plasmid_multiturn.plugin, generate="multiturn", **options)
    generate = build("generate", "multiturn", plasmid_multiturn.plugin, config=config)
    ctx = RolloutContext(config=config, engines=[engine], data_source=None, tokenizer=tokenizer, generate=generate,
                         rewards=None, tools={tool.name: tool for tool in tools})
    return ctx, generate


def prompt_sample(text: str = "Q:") -> Sample:
    prompt_ids = [BOS, *ids(text)]
    return Sample(prompt=text, tokens=prompt_ids, metadata={"source": "test"}, index=3, group_index=1)


PARAMS = SamplingParams(max_new_tokens=200, stop_token_ids=(EOS,), seed=11)


def run_one(ctx, sample, params=PARAMS):
    return asyncio.run(ctx.generate(ctx, sample, params))


# ---------------------------------------------------------------------------------- the layout
def test_a_three_turn_conversation_keeps_exactly_the_engines_tokens_and_the_tools_text():
    first = ids(call("add", a=2, b=3))
    after_call = ids(" and more") + [EOS]   # generated after the complete call in the same turn: cut
    second = ids("so " + call("add", a=5, b=10))
    third = ids("15") + [EOS]
    engine = ScriptedEngine([Reply(first + after_call, logprobs(len(first + after_call), 1)),
                             Reply(second, logprobs(len(second), 100)),
                             Reply(third, logprobs(len(third), 200))])
    ctx, _ = make_context(engine, [Add()])
    prompt = prompt_sample()
    prompt_ids = list(prompt.tokens)
    sample = run_one(ctx, prompt)

    tool1, tool2 = ids(answer("5")), ids(answer("15"))
    response = first + tool1 + second + tool2 + third
    assert sample.tokens == prompt_ids + response
    assert sample.response_length == len(response) and sample.prompt_tokens == prompt_ids
    assert sample.loss_mask == [1] * len(first) + [0] * len(tool1) + [1] * len(second) + [0] * len(tool2) + \
        [1] * len(third)
    assert sample.rollout_logprobs == (logprobs(len(first), 1) + [0.0] * len(tool1) + logprobs(len(second), 100)
                                       + [0.0] * len(tool2) + logprobs(len(third), 200))
    assert sample.response == TOKENIZER.decode(response, skip_special_tokens=True)
    assert sample.response.endswith(answer("15") + "15")
    assert sample.status == Status.COMPLETED and sample.weight_version == 0
    # each turn's prompt extends the previous one's tokens
    sent = [c.prompt_ids for c in engine.calls]
    assert sent == [prompt_ids, prompt_ids + first + tool1, prompt_ids + first + tool1 + second + tool2]
    assert [c.params.seed for c in engine.calls] == [11, 12, 13]
    assert all(c.params.stop_token_ids == (EOS,) for c in engine.calls)
    assert sample.metadata["source"] == "test"
    assert sample.metadata["rollout_metrics"] == {"turns_mean": 3.0, "tool_calls_mean": 2.0, "tool_errors_mean": 0.0,
                                                  "tool_seconds_mean": pytest.approx(
                                                      sample.metadata["multiturn"]["tool_seconds"]),
                                                  "truncated_fraction": 0.0}


def test_a_closing_tag_that_is_one_token_stops_the_engine_at_the_call():
    tokenizer = CharTokenizer(specials=("</tool_call>",))
    first = tokenizer.encode(call("add", a=1, b=1), add_special_tokens=False)
    assert first[-1] == 1000
    engine = ScriptedEngine([Reply(first + tokenizer.encode("zz", add_special_tokens=False)),
                             Reply(tokenizer.encode("2", add_special_tokens=False) + [EOS])])
    ctx, _ = make_context(engine, [Add()], tokenizer=tokenizer)
    sample = run_one(ctx, prompt_sample())
    assert engine.calls[0].params.stop_token_ids == (EOS, 1000)
    tool = tokenizer.encode(answer("2"), add_special_tokens=False)
    assert sample.response_tokens == first + tool + tokenizer.encode("2", add_special_tokens=False) + [EOS]


def test_sample_metadata_is_not_shared_between_the_samples_of_a_group():
    engine = ScriptedEngine(lambda prompt, params: Reply(ids("7") + [EOS]))
    ctx, _ = make_context(engine)
    shared = {"source": "x"}
    one, two = prompt_sample(), prompt_sample()
    one.metadata = two.metadata = shared
    run_one(ctx, one)
    assert shared == {"source": "x"} and "rollout_metrics" in one.metadata
    assert two.metadata is shared


def test_an_answer_without_a_call_is_one_turn_as_single_turn_would_give():
    reply = ids("42") + [EOS]
    engine = ScriptedEngine([Reply(reply, logprobs(3, 5))])
    ctx, _ = make_context(engine)
    sample = run_one(ctx, prompt_sample())
    assert sample.response_tokens == reply and sample.loss_mask == [1, 1, 1]
    assert sample.rollout_logprobs == logprobs(3, 5) and sample.response == "42"
    assert sample.metadata["rollout_metrics"]["turns_mean"] == 1.0
    assert sample.metadata["rollout_metrics"]["tool_calls_mean"] == 0.0


# ---------------------------------------------------------------------------------- tool failures
@pytest.mark.parametrize(("behaviour", "told"), [
    ("raise", "error: tool 'probe' failed: RuntimeError: disk on fire second line"),
    ("tool-error", "error: no such city"),
    ("hang", "error: tool 'probe' did not answer within 0.05 s"),
    ("flood", "x" * 10 + " [cut: the answer had 50 characters, the limit is 10]"),
    ("number", "error: tool 'probe' answered int, not text or content parts"),
    ("parts", "error: tool 'probe' answer part 1 is not a text or image_url part: {'type': 'audio'}"),
    ("image", "error: images need a vision-language policy, and no --model is set"),
    ("long-parts", "error: tool 'probe' answered 12 characters of text, the limit is 10"),
])
@pytest.mark.timeout(60)
def test_a_failing_tool_is_told_to_the_model_counted_and_the_rollout_goes_on(behaviour, told):
    first = ids(call("probe"))
    final = ids("fine") + [EOS]
    engine = ScriptedEngine([Reply(first), Reply(final)])
    tool = Scripted("probe", behaviour)
    ctx, _ = make_context(engine, [tool], tool_timeout=0.05, tool_max_output_chars=10)
    sample = run_one(ctx, prompt_sample())
    assert sample.status == Status.COMPLETED and tool.calls == 1
    assert sample.response_tokens == first + ids(answer(told)) + final
    assert sample.metadata["rollout_metrics"]["tool_errors_mean"] == 1.0
    assert sample.metadata["rollout_metrics"]["tool_calls_mean"] == 1.0
    if behaviour == "hang":
        assert tool.cancelled and 0.04 < sample.metadata["rollout_metrics"]["tool_seconds_mean"] < 5


@pytest.mark.parametrize(("text", "told"), [
    ("<tool_call>{not json}</tool_call>", "error: the tool call is not valid JSON (Expecting property name enclosed "
                                          "in double quotes at character 1)"),
    ('<tool_call>["add"]</tool_call>', 'error: a tool call is a JSON object {"name": "...", "arguments": {...}}'),
    ('<tool_call>{"name": "add", "arguments": 3}</tool_call>',
     "error: the tool call's arguments must be a JSON object"),
    (call("subtract", a=1), "error: there is no tool 'subtract' (tools: add)"),
    (call("add", a="x", b=1), "error: a and b must be integers"),
])
def test_a_call_that_cannot_be_run_is_told_to_the_model_as_a_tool_error(text, told):
    engine = ScriptedEngine([Reply(ids(text)), Reply([EOS])])
    ctx, _ = make_context(engine, [Add()])
    sample = run_one(ctx, prompt_sample())
    assert sample.response_tokens == ids(text) + ids(answer(told)) + [EOS]
    assert sample.metadata["rollout_metrics"]["tool_errors_mean"] == 1.0


def test_arguments_given_as_a_json_string_are_accepted():
    text = '<tool_call>{"name": "add", "arguments": "{\\"a\\": 4, \\"b\\": 5}"}</tool_call>'
    engine = ScriptedEngine([Reply(ids(text)), Reply([EOS])])
    ctx, _ = make_context(engine, [Add()])
    assert run_one(ctx, prompt_sample()).response_tokens == ids(text) + ids(answer("9")) + [EOS]


# ---------------------------------------------------------------------------------- limits
def test_max_turns_ends_a_conversation_that_keeps_calling_without_running_the_last_call():
    turn = ids(call("probe"))
    engine = ScriptedEngine(lambda prompt, params: Reply(turn))
    tool = Scripted("probe", "answer")
    ctx, _ = make_context(engine, [tool], max_turns=2)
    sample = run_one(ctx, prompt_sample())
    assert len(engine.calls) == 2 and tool.calls == 1
    assert sample.response_tokens == turn + ids(answer("ok")) + turn
    assert sample.status == Status.TRUNCATED
    assert sample.metadata["rollout_metrics"]["truncated_fraction"] == 1.0
    assert sample.metadata["rollout_metrics"]["turns_mean"] == 2.0


def test_the_response_budget_counts_every_turn_and_tool_answer_together():
    turn = ids(call("probe"))                                   # 39 tokens
    told = ids(answer("ok"))                                    # 33 tokens
    engine = ScriptedEngine(lambda prompt, params: Reply(turn + ids("tail")))
    ctx, _ = make_context(engine, [Scripted("probe", "answer")], max_turns=10,
                          max_response_tokens=len(turn) + len(told) + 5)
    sample = run_one(ctx, prompt_sample())
    # the second turn may generate only what is left of the budget
    assert [c.params.max_new_tokens for c in engine.calls] == [len(turn) + len(told) + 5, 5]
    assert sample.response_tokens == turn + told + turn[:5]
    assert sample.response_length == len(turn) + len(told) + 5 and sample.status == Status.TRUNCATED
    assert sample.metadata["rollout_metrics"]["truncated_fraction"] == 1.0


def test_a_tool_answer_that_does_not_fit_the_budget_is_cut_to_fit():
    turn = ids(call("probe"))
    engine = ScriptedEngine([Reply(turn)])
    ctx, _ = make_context(engine, [Scripted("probe", "answer")], max_response_tokens=len(turn) + 4)
    sample = run_one(ctx, prompt_sample())
    assert sample.response_tokens == turn + ids(answer("ok"))[:4]
    assert sample.loss_mask == [1] * len(turn) + [0] * 4 and sample.status == Status.TRUNCATED


def test_a_tool_answer_of_text_parts_only_is_appended_as_their_text():
    first = ids(call("probe"))
    final = ids("fine") + [EOS]
    ctx, _ = make_context(ScriptedEngine([Reply(first), Reply(final)]), [Scripted("probe", "text-parts")])
    sample = run_one(ctx, prompt_sample())
    assert sample.response_tokens == first + ids(answer("ok")) + final
    assert sample.metadata["rollout_metrics"]["tool_errors_mean"] == 0.0


def test_the_default_budget_is_max_turns_times_max_new_tokens():
    engine = ScriptedEngine([Reply([EOS])])
    ctx, generate = make_context(engine, max_turns=3)
    assert generate.options.budget(16) == 48
    run_one(ctx, prompt_sample(), SamplingParams(max_new_tokens=16, stop_token_ids=(EOS,)))
    assert engine.calls[0].params.max_new_tokens == 16


def test_a_turn_that_hits_max_new_tokens_without_a_call_is_truncated_like_single_turn():
    engine = ScriptedEngine([Reply(ids("123456"))])
    ctx, _ = make_context(engine)
    sample = run_one(ctx, prompt_sample(), SamplingParams(max_new_tokens=4, stop_token_ids=(EOS,)))
    assert sample.response_tokens == ids("1234") and sample.status == Status.TRUNCATED


# ---------------------------------------------------------------------------------- partial rollouts, abort
def test_an_aborted_sample_resumes_mid_conversation_with_its_tokens_and_counters():
    first = ids(call("add", a=1, b=2))
    partial, rest = ids("the ans"), ids("wer is 3") + [EOS]
    engine = ScriptedEngine([Reply(first, logprobs(len(first), 1)),
                             Reply(partial, logprobs(len(partial), 100), status=Status.ABORTED)])
    ctx, _ = make_context(engine, [Add()])
    sample = run_one(ctx, prompt_sample())
    told = ids(answer("3"))
    assert sample.status == Status.ABORTED and sample.response_tokens == first + told + partial
    assert sample.metadata["multiturn"]["turns"] == 2

    resumed_engine = ScriptedEngine([Reply(rest, logprobs(len(rest), 200))])
    ctx.engines = [resumed_engine]
    sample = run_one(ctx, sample)
    assert resumed_engine.calls[0].prompt_ids == prompt_sample().tokens + first + told + partial
    assert sample.status == Status.COMPLETED
    assert sample.response_tokens == first + told + partial + rest
    assert sample.loss_mask == [1] * len(first) + [0] * len(told) + [1] * len(partial + rest)
    assert sample.rollout_logprobs == (logprobs(len(first), 1) + [0.0] * len(told) + logprobs(len(partial), 100)
                                       + logprobs(len(rest), 200))
    assert sample.metadata["rollout_metrics"]["turns_mean"] == 2.0
    assert sample.metadata["rollout_metrics"]["tool_calls_mean"] == 1.0
    # the resumed turn may generate only what its first part left of --max-new-tokens
    assert resumed_engine.calls[0].params.max_new_tokens == PARAMS.max_new_tokens - len(partial)


def test_a_turn_aborted_right_after_its_call_runs_the_tool_when_resumed():
    first = ids(call("add", a=1, b=2))
    engine = ScriptedEngine([Reply(first + ids("xx"), status=Status.ABORTED)])
    ctx, _ = make_context(engine, [Add()], mask_offpolicy_in_partial_rollout=True)
    sample = run_one(ctx, prompt_sample())
    assert sample.status == Status.ABORTED and sample.response_tokens == first
    ctx.engines = [ScriptedEngine([Reply(ids("3") + [EOS])])]
    sample = run_one(ctx, sample)
    told = ids(answer("3"))
    assert sample.response_tokens == first + told + ids("3") + [EOS]
    assert sample.loss_mask == [0] * len(first) + [0] * len(told) + [1, 1]   # older weights made the first turn


@pytest.mark.timeout(60)
def test_cancelling_a_rollout_during_a_tool_call_cancels_the_call_at_once():
    engine = ScriptedEngine([Reply(ids(call("probe")))])
    tool = Scripted("probe", "hang")
    ctx, _ = make_context(engine, [tool], tool_timeout=30)

    async def abort_mid_call():
        task = asyncio.ensure_future(ctx.generate(ctx, prompt_sample(), PARAMS))
        while not tool.calls:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 5)

    asyncio.run(abort_mid_call())
    assert tool.cancelled


def test_a_finished_sample_is_returned_unchanged():
    engine = ScriptedEngine([])
    ctx, _ = make_context(engine)
    done = prompt_sample()
    done.status = Status.COMPLETED
    assert run_one(ctx, done) is done and engine.calls == []


def test_it_is_registered_as_a_generate_function():
    assert isinstance(build("generate", "multiturn", plasmid_multiturn.plugin,
                            config=make_config(plasmid_multiturn.plugin)), MultiTurn)


@pytest.mark.timeout(60)
def test_an_abort_during_a_tool_call_returns_the_partial_conversation_which_resumes_at_the_call():
    """``ctx.aborting`` set while a tool runs: the call is cancelled at once and the sample comes back
    ``ABORTED`` with the tokens, masks and log-probs so far and its turn state; resumed, it runs the call."""
    first = ids(call("add", a=1, b=2))
    engine = ScriptedEngine([Reply(first, logprobs(len(first), 1))])

    class SlowAdd(Add):
        """Hangs while ``slow`` (counting its calls and cancellations), then adds."""

        slow, calls, cancelled = True, 0, 0

        async def __call__(self, arguments, sample):
            SlowAdd.calls += 1
            try:
                while SlowAdd.slow:
                    await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                SlowAdd.cancelled += 1
                raise
            return await super().__call__(arguments, sample)

    ctx, _ = make_context(engine, [SlowAdd()], tool_timeout=60)
    prompt_ids = list(prompt_sample().tokens)

    async def abort_mid_call():
        task = asyncio.ensure_future(ctx.generate(ctx, prompt_sample(), PARAMS))
        while not SlowAdd.calls:
            await asyncio.sleep(0.01)
        ctx.aborting.set()
        return await asyncio.wait_for(task, 5)

    sample = asyncio.run(abort_mid_call())
    assert SlowAdd.cancelled == 1 and len(engine.calls) == 1
    assert sample.status == Status.ABORTED
    assert sample.tokens == prompt_ids + first and sample.response_length == len(first)
    assert sample.loss_mask == [1] * len(first) and sample.rollout_logprobs == logprobs(len(first), 1)
    state = sample.metadata["multiturn"]
    assert (state["turns"], state["tool_calls"], state["turn_start"]) == (1, 0, 0)

    # a later step (a new, unset event) continues the conversation: the call runs, then the answer
    rest = ids("3") + [EOS]
    ctx.engines, ctx.aborting = [ScriptedEngine([Reply(rest, logprobs(len(rest), 100))])], asyncio.Event()
    SlowAdd.slow = False
    sample = run_one(ctx, sample)
    told = ids(answer("3"))
    assert sample.status == Status.COMPLETED and SlowAdd.calls == 2
    assert ctx.engines[0].calls[0].prompt_ids == prompt_ids + first + told
    assert sample.tokens == prompt_ids + first + told + rest
    assert sample.loss_mask == [1] * len(first) + [0] * len(told) + [1] * len(rest)
    assert sample.rollout_logprobs == logprobs(len(first), 1) + [0.0] * len(told) + logprobs(len(rest), 100)
    assert sample.metadata["rollout_metrics"]["turns_mean"] == 2.0
    assert sample.metadata["rollout_metrics"]["tool_calls_mean"] == 1.0


def test_once_the_step_is_aborting_no_new_turn_is_started():
    first = ids(call("add", a=1, b=2))
    engine = ScriptedEngine([Reply(first), Reply(ids("3") + [EOS])])
    ctx, _ = make_context(engine, [Add()])
    ctx.aborting.set()
    sample = run_one(ctx, prompt_sample())
    assert engine.calls == [] and sample.status == Status.ABORTED and sample.response_length == 0


# ---------------------------------------------------------------------------------- --tool-call-format mistral
def mistral_calls(*entries) -> str:
    return "[TOOL_CALLS]" + json.dumps([{"name": name, "arguments": arguments} for name, arguments in entries])


def mistral_results(*answers) -> str:
    return "".join("[TOOL_RESULTS]" + json.dumps({"content": answer}) + "[/TOOL_RESULTS]" for answer in answers)


def test_several_calls_in_one_turn_are_run_in_order_and_answered_in_order():
    first = ids("let me add " + mistral_calls(("add", {"a": 2, "b": 3}), ("add", {"a": 10, "b": 20})))
    after = ids(" more text") + [EOS]  # after the complete list: cut
    second = ids("5 and 30") + [EOS]
    engine = ScriptedEngine([Reply(first + after, logprobs(len(first + after), 1)),
                             Reply(second, logprobs(len(second), 100))])
    ctx, generate = make_context(engine, [Add()], tool_call_format="mistral")
    assert isinstance(generate.format, Mistral)
    prompt_ids = list(prompt_sample().tokens)
    sample = run_one(ctx, prompt_sample())

    told = ids(mistral_results("5", "30"))
    assert sample.tokens == prompt_ids + first + told + second
    assert sample.loss_mask == [1] * len(first) + [0] * len(told) + [1] * len(second)
    assert sample.rollout_logprobs == logprobs(len(first), 1) + [0.0] * len(told) + logprobs(len(second), 100)
    assert [c.prompt_ids for c in engine.calls] == [prompt_ids, prompt_ids + first + told]
    assert sample.status == Status.COMPLETED
    metrics = sample.metadata["rollout_metrics"]
    assert (metrics["turns_mean"], metrics["tool_calls_mean"], metrics["tool_errors_mean"]) == (2.0, 2.0, 0.0)


def test_a_bad_entry_is_answered_with_an_error_and_the_others_still_run():
    probe = Scripted("probe", "ok")
    first = ids(mistral_calls(("nope", {}), ("probe", {}))[:-1] + ', {"arguments": {}}]')
    engine = ScriptedEngine([Reply(first), Reply(ids("done") + [EOS])])
    ctx, _ = make_context(engine, [probe], tool_call_format="mistral")
    sample = run_one(ctx, prompt_sample())
    told = engine.calls[1].prompt_ids[len(prompt_sample().tokens) + len(first):]
    text = "".join(chr(t - 3) for t in told)
    assert text.count("[TOOL_RESULTS]") == 3 and probe.calls == 1
    assert "there is no tool 'nope'" in text and '"content": "ok"' in text and "a tool call is a JSON object" in text
    assert sample.metadata["rollout_metrics"]["tool_calls_mean"] == 3.0
    assert sample.metadata["rollout_metrics"]["tool_errors_mean"] == 2.0


@pytest.mark.parametrize(("text", "found"), [
    ("no call here", None),
    ('[TOOL_CALLS][{"name": "add", "arguments": {"a": 1', None),         # not complete yet
    ('[TOOL_CALLS] {"name": "add", "arguments": "{\\"a\\": 1}"} tail', ("add", {"a": 1}, 0)),  # one object
    ('x[TOOL_CALLS][{"name": "a", "arguments": {}}, {"name": "b", "arguments": {}}]', ("a", {}, 1)),
])
def test_a_call_is_complete_where_its_json_ends(text, found):
    call = Mistral().find_call(text)
    if found is None:
        assert call is None
        return
    assert (call.name, call.arguments, len(call.siblings)) == found and not call.error
    assert text[:call.end].endswith(("}", "]"))


@pytest.mark.parametrize(("text", "end"), [("[TOOL_CALLS][]", 14), ("[TOOL_CALLS] 12", 13),
                                           ("[TOOL_CALLS]true false", 16)])
def test_an_empty_or_non_list_call_is_told_to_the_model(text, end):
    call = Mistral().find_call(text)
    assert call.error and call.end == end and not call.name
    assert Mistral().find_call("[TOOL_CALLS]  ") is None
    assert Mistral().find_call("[TOOL_CALLS]true") is None  # may yet become [TOOL_CALLS]true[ARGS]{...}


def test_a_turn_the_engine_refuses_as_past_the_context_ends_the_conversation_truncated():
    from plasmid.errors import ContextLengthError

    first = ids(call("add", a=2, b=3))
    context = len(prompt_sample().tokens) + len(first) + len(ids(answer("5"))) + 10

    def engine_of_context(prompt_ids, params):
        if len(prompt_ids) + params.max_new_tokens > context:
            raise ContextLengthError(context, len(prompt_ids), params.max_new_tokens)
        return Reply(first)

    ctx, _ = make_context(ScriptedEngine(engine_of_context), [Add()])
    sample = run_one(ctx, prompt_sample(), SamplingParams(max_new_tokens=len(first), stop_token_ids=(EOS,), seed=1))
    assert sample.status == Status.TRUNCATED, "the second turn did not fit the context"
    assert sample.response_tokens == first + ids(answer("5")), "the first turn and its tool answer are kept"
    assert sample.metadata["rollout_metrics"]["truncated_fraction"] == 1.0
    with pytest.raises(ContextLengthError):  # a prompt that does not fit at all is the caller's to refuse
        run_one(ctx, prompt_sample(), SamplingParams(max_new_tokens=context, stop_token_ids=(EOS,), seed=1))


# ---------------------------------------------------------------------------------- --tool-parser, --reasoning-parser
# The calls of every parser of the shared family (and of one a test registers) are run, and the
# sample's tokens are exactly the engine's tokens, cut at the call, and the appended tool answer;
# parsing never changes them. A call inside the reasoning is not run.
#: The call add(a=2, b=3) in each parser's syntax.
CALLS = {
    "hermes": '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>',
    "qwen25": '<tool_call>\n{"name": "add", "arguments": "{\\"a\\": 2, \\"b\\": 3}"}\n</tool_call>',
    "llama3_json": '{"name": "add", "parameters": {"a": 2, "b": 3}}',
    "mistral": '[TOOL_CALLS]add[ARGS]{"a": 2, "b": 3}',
    "deepseek_v3": ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n"
                    '{"a": 2, "b": 3}\n```<｜tool▁call▁end｜>'),
    "qwen3_coder": ("<tool_call>\n<function=add>\n<parameter=a>\n2\n</parameter>\n<parameter=b>\n3\n</parameter>\n"
                    "</function>\n</tool_call>"),
    "pythonic": "[add(a=2, b=3)]",
}


class Recording(Add):
    def __init__(self):
        self.seen = []

    async def __call__(self, arguments, sample):
        self.seen.append(arguments)
        return await super().__call__(arguments, sample)


def run_with(text: str, after: str, **options):
    first, rest, second = ids(text), ids(after) + [EOS], ids("5") + [EOS]
    engine = ScriptedEngine([Reply(first + rest, logprobs(len(first + rest), 1)),
                             Reply(second, logprobs(len(second), 100))])
    tool = Recording()
    ctx, _ = make_context(engine, [tool], **options)
    return run_one(ctx, prompt_sample()), engine, tool, first, second


@pytest.mark.parametrize("name", sorted(CALLS))
def test_every_parser_runs_its_call_and_the_tokens_stay_the_engines(name):
    assert name in TOOL_PARSERS.names()
    sample, engine, tool, first, second = run_with(CALLS[name], " and more", tool_parser=name)

    assert tool.seen == [{"a": 2, "b": 3}]
    told = ids(answer("5"))
    prompt = [BOS, *ids("Q:")]
    assert sample.tokens == prompt + first + told + second  # the engine's ids, cut after the call
    assert sample.loss_mask == [1] * len(first) + [0] * len(told) + [1] * len(second)
    assert sample.rollout_logprobs == logprobs(len(first), 1) + [0.0] * len(told) + logprobs(len(second), 100)
    trained = [t for t, m in zip(sample.response_tokens, sample.loss_mask, strict=True) if m]
    assert trained == first + second  # what is trained on: the engine's tokens, in order, none re-encoded
    assert [c.prompt_ids for c in engine.calls] == [prompt, prompt + first + told]


def test_a_parser_a_test_registers_is_used_by_multiturn():
    class Braces(ToolParser):
        def spans(self, text, tools=None):
            return [CallSpan(m.start(), m.end(), (ToolCall(m.group(1), {"a": int(m.group(2)), "b": int(m.group(3))}),))
                    for m in re.finditer(r"\{\{(\w+) (\d+) (\d+)\}\}", text)]

    TOOL_PARSERS.register("braces", Braces, origin="this test")
    try:
        sample, _, tool, first, second = run_with("{{add 2 3}}", " tail", tool_parser="braces")
    finally:
        TOOL_PARSERS.unregister("braces")
    assert tool.seen == [{"a": 2, "b": 3}]
    assert sample.response_tokens == first + ids(answer("5")) + second


def test_a_call_inside_the_reasoning_is_not_run_and_one_after_it_is():
    inside = CALLS["hermes"].replace('"a": 2', '"a": 100')
    text = f"<think>maybe {inside}</think>{CALLS['hermes']}"
    sample, _, tool, first, second = run_with(text, "", reasoning_parser="qwen3")
    assert tool.seen == [{"a": 2, "b": 3}]
    assert sample.response_tokens == first + ids(answer("5")) + second


def test_a_turn_still_thinking_has_no_call():
    text = f"<think>{CALLS['hermes']}"
    first = ids(text) + [EOS]
    engine = ScriptedEngine([Reply(first)])
    tool = Recording()
    ctx, _ = make_context(engine, [tool], reasoning_parser="deepseek_r1")
    sample = run_one(ctx, prompt_sample())
    assert tool.seen == [] and sample.response_tokens == first


def test_the_compact_format_refuses_the_parser_options_in_one_line():
    with pytest.raises(UsageError, match="^--tool-call-format compact reads only its own"):
        make_context(ScriptedEngine([]), [], tool_call_format="compact", tool_parser="hermes")


def test_an_unknown_parser_name_is_a_usage_error_naming_the_flag():
    with pytest.raises(UsageError, match="^--tool-parser 'hermez': choose one of"):
        make_context(ScriptedEngine([]), [], tool_parser="hermez")


# ---------------------------------------------------------------------------------- several calls in one turn
# A turn's calls are all its complete calls, in order, up to one whose syntax closes the turn's
# calls; each runs in order, the answers are appended in order as the format answers several
# calls, and the turn is cut after its last call (the engine's end of turn too): the sample keeps
# the engine's own tokens.
def llama(a, b):
    return json.dumps({"name": "add", "parameters": {"a": a, "b": b}})


def deepseek(*pairs):
    return ("<｜tool▁calls▁begin｜>" + "".join(
        f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n{json.dumps({'a': a, 'b': b})}\n```"
        "<｜tool▁call▁end｜>" for a, b in pairs) + "<｜tool▁calls▁end｜>")


def harmony(a, b):
    return ("<|channel|>analysis<|message|>Add them.<|end|><|start|>assistant<|channel|>commentary to=functions.add "
            f"<|constrain|>json<|message|>{json.dumps({'a': a, 'b': b})}<|call|>")


# format, parser, the turn as the model writes it (its calls and what follows them: cut), its calls' (a, b)
SEVERAL = {
    "hermes": ("tagged", None, f"{call('add', a=2, b=3)}\n{call('add', a=10, b=20)}", " done", [(2, 3), (10, 20)]),
    "llama3_json": ("tagged", "llama3_json", f"<|python_tag|>{llama(2, 3)}; {llama(10, 20)}", "", [(2, 3), (10, 20)]),
    "mistral-v11": ("mistral", None, '[TOOL_CALLS]add[ARGS]{"a": 2, "b": 3}[TOOL_CALLS]add[ARGS]{"a": 10, "b": 20}',
                    "", [(2, 3), (10, 20)]),
    # a list closes the turn's calls: a second [TOOL_CALLS] after it is cut, not run
    "mistral-v3": ("mistral", None, mistral_calls(("add", {"a": 2, "b": 3}), ("add", {"a": 10, "b": 20})),
                   mistral_calls(("add", {"a": 7, "b": 7})), [(2, 3), (10, 20)]),
    # the calls block ends at its closing marker, which the turn keeps; a later block is cut
    "deepseek_v3": ("tagged", "deepseek_v3", deepseek((2, 3), (10, 20)), deepseek((7, 7)), [(2, 3), (10, 20)]),
    # gpt-oss ends its turn at <|call|>: one call per turn, what follows is cut
    "openai": ("tagged", "openai", harmony(2, 3), harmony(7, 7), [(2, 3)]),
}
MARKERS = ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
           "<｜tool▁sep｜>", "<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>", "<|constrain|>",
           "[TOOL_CALLS]", "[ARGS]", "<|python_tag|>")


@pytest.mark.parametrize("case", sorted(SEVERAL))
def test_every_call_of_a_turn_runs_in_order_and_the_tokens_stay_the_engines(case):
    fmt, parser, turn, after, expected = SEVERAL[case]
    tokenizer = CharTokenizer(specials=MARKERS)
    first = tokenizer.encode(turn, add_special_tokens=False)
    rest = tokenizer.encode(after, add_special_tokens=False) + [EOS]
    second = tokenizer.encode("done", add_special_tokens=False) + [EOS]
    engine = ScriptedEngine([Reply(first + rest, logprobs(len(first + rest), 1)),
                             Reply(second, logprobs(len(second), 100))])
    tool = Recording()
    options = {"tool_call_format": fmt} | ({"tool_parser": parser} if parser else {})
    ctx, _ = make_context(engine, [tool], tokenizer=tokenizer, **options)
    sample = run_one(ctx, prompt_sample())

    assert tool.seen == [{"a": a, "b": b} for a, b in expected]
    sums = [str(a + b) for a, b in expected]
    told_text = mistral_results(*sums) if fmt == "mistral" else "".join(answer(s) for s in sums)
    told = tokenizer.encode(told_text, add_special_tokens=False)
    prompt = [BOS, *ids("Q:")]
    assert sample.tokens == prompt + first + told + second  # the engine's ids, cut after the turn's last call
    assert sample.loss_mask == [1] * len(first) + [0] * len(told) + [1] * len(second)
    assert sample.rollout_logprobs == logprobs(len(first), 1) + [0.0] * len(told) + logprobs(len(second), 100)
    assert [c.prompt_ids for c in engine.calls] == [prompt, prompt + first + told]
    assert sample.metadata["rollout_metrics"]["tool_calls_mean"] == float(len(expected))


def test_a_turn_cut_short_runs_its_complete_calls_and_drops_the_unfinished_one():
    done, unfinished = call("add", a=2, b=3) + " ", '<tool_call>{"name": "add", "arguments": {"a"'
    first = ids(done + unfinished)
    keep = len(ids(call("add", a=2, b=3)))
    engine = ScriptedEngine([Reply(first), Reply(ids("5") + [EOS])])
    tool = Recording()
    ctx, _ = make_context(engine, [tool])
    sample = run_one(ctx, prompt_sample(), SamplingParams(max_new_tokens=len(first), stop_token_ids=(EOS,), seed=1))
    assert tool.seen == [{"a": 2, "b": 3}]
    assert sample.response_tokens[:keep + len(ids(answer("5")))] == first[:keep] + ids(answer("5"))


def test_a_malformed_call_among_several_is_answered_with_its_error_and_the_others_run():
    turn = f"{call('add', a=1, b=1)}<tool_call>{{nope}}</tool_call>{call('add', a=2, b=2)}"
    engine = ScriptedEngine([Reply(ids(turn) + [EOS]), Reply(ids("ok") + [EOS])])
    tool = Recording()
    ctx, _ = make_context(engine, [tool])
    sample = run_one(ctx, prompt_sample())
    assert tool.seen == [{"a": 1, "b": 1}, {"a": 2, "b": 2}]
    told = TOKENIZER.decode(engine.calls[1].prompt_ids[len(prompt_sample().tokens) + len(ids(turn)):])
    assert told.startswith(answer("2") + "<tool_response>error: the tool call is not valid JSON")
    assert told.endswith(answer("4"))
    assert sample.metadata["rollout_metrics"]["tool_errors_mean"] == 1.0
