"""Formats whose markers the tokenizer makes special tokens (Mistral's ``[TOOL_CALLS]``, gpt-oss's
harmony ``<|channel|>`` ...): ``skip_special_tokens=True`` would drop them, so the gateway parses the
reply decoded with its special tokens kept, and the client sees no special token the parser did
not consume. The recorded tokens stay exactly the engine's."""

from __future__ import annotations

import re

import pytest
from conftest import TOOL_ALPHABET, TOOL_TEMPLATE, ScriptedEngine
from test_agent_protocol import CALCULATOR, client_of, run_agent

MISTRAL_MARKERS = ["[TOOL_CALLS]"]
HARMONY_MARKERS = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>", "<|constrain|>"]
CALC = '{"expression": "2*3"}'


def marker_tokenizer(markers):
    """The agent tests' character tokenizer and template, with ``markers`` as special tokens."""
    from plasmid_torch.tiny import char_tokenizer

    tokenizer = char_tokenizer(TOOL_ALPHABET)
    tokenizer.chat_template = TOOL_TEMPLATE
    tokenizer.add_special_tokens({"additional_special_tokens": markers})
    return tokenizer


def ask_twice(seen, stream):
    """An agent asking twice with the calculator offered, recording ``(reasoning, content, calls)``."""

    async def agent(session):
        client = client_of(session)
        for _ in range(2):
            if stream:
                chunks = [c async for c in await client.chat.completions.create(
                    model=session.model, messages=session.messages, tools=[CALCULATOR], stream=True)]
                deltas = [c.choices[0].delta for c in chunks if c.choices]
                seen.append(("".join(getattr(d, "reasoning_content", None) or "" for d in deltas) or None,
                             "".join(d.content or "" for d in deltas) or None,
                             [(t.function.name, t.function.arguments) for d in deltas for t in d.tool_calls or []]))
            else:
                message = (await client.chat.completions.create(
                    model=session.model, messages=session.messages, tools=[CALCULATOR])).choices[0].message
                seen.append((getattr(message, "reasoning_content", None), message.content,
                             [(t.function.name, t.function.arguments) for t in message.tool_calls or []]))
        return 1.0

    return agent


def engine_tokens(outs):
    return [o.response_tokens for o in (outs if isinstance(outs, list) else [outs])]


@pytest.mark.parametrize("stream", [False, True])
def test_a_mistral_call_whose_marker_is_a_special_token_is_read(tmp_path, stream):
    tokenizer = marker_tokenizer(MISTRAL_MARKERS)
    reply = f'[TOOL_CALLS][{{"name": "calculator", "arguments": {CALC}}}]<eos>'
    engine = ScriptedEngine(tokenizer, [reply, "it is 6<eos>"])
    assert "[TOOL_CALLS]" not in tokenizer.decode(engine.replies[0], skip_special_tokens=True)
    seen = []
    outs = run_agent(tmp_path, ask_twice(seen, stream), tokenizer, engine, tool_parser="mistral")
    assert seen == [(None, None, [("calculator", CALC)]), (None, "it is 6", [])]
    assert engine_tokens(outs) == engine.replies, "the record keeps the engine's tokens"


@pytest.mark.parametrize("stream", [False, True])
def test_gpt_oss_harmony_replies_give_reasoning_calls_and_a_clean_answer(tmp_path, stream):
    tokenizer = marker_tokenizer(HARMONY_MARKERS)
    call = ("<|channel|>analysis<|message|>two times three<|end|><|start|>assistant<|channel|>commentary "
            f"to=functions.calculator <|constrain|>json<|message|>{CALC}<|call|>")
    final = "<|channel|>final<|message|>it is 6<|return|>"
    engine = ScriptedEngine(tokenizer, [call, final])
    seen = []
    outs = run_agent(tmp_path, ask_twice(seen, stream), tokenizer, engine, tool_parser="openai",
                     reasoning_parser="openai_gptoss")
    assert seen == [("two times three", None, [("calculator", CALC)]), (None, "it is 6", [])]
    assert engine_tokens(outs) == engine.replies, "the record keeps the engine's tokens"


def test_special_tokens_the_parser_leaves_are_not_shown(tmp_path):
    tokenizer = marker_tokenizer(HARMONY_MARKERS)
    engine = ScriptedEngine(tokenizer, ["<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>final"
                                        "<|message|>it is 6<|return|>", "plain <eos>"])
    seen = []
    run_agent(tmp_path, ask_twice(seen, False), tokenizer, engine, tool_parser="openai",
              reasoning_parser="openai_gptoss")
    assert seen == [("hm", "it is 6", []), (None, "plain ", [])]  # a reply nothing parses is shown as before


def test_a_parser_of_plain_text_never_reads_a_special_tokens_text(tmp_path):
    """A parser without ``reads_special_tokens`` (a third party's, by default) reads what the client
    sees: a special token whose text would match its syntax (``<b>`` then a digit, for a parser of
    ``>d`` calls) makes no call."""
    from plasmid_serving.parsers import TOOL_PARSERS, ToolParser
    from plasmid_serving.parsers.base import CallSpan, ToolCall

    class ArrowDigit(ToolParser):
        name = "arrow-digit-test"

        def spans(self, text, tools=None):
            return [CallSpan(m.start(), m.end(), (ToolCall("calculator", {"expression": m.group(1)}),))
                    for m in re.finditer(r">(\d)", text)]

    TOOL_PARSERS.register(ArrowDigit.name, ArrowDigit, origin=__file__)
    try:
        tokenizer = marker_tokenizer(["<b>"])
        engine = ScriptedEngine(tokenizer, ["<b>7 then >3<eos>", "ok<eos>"])
        seen = []
        outs = run_agent(tmp_path, ask_twice(seen, False), tokenizer, engine, tool_parser=ArrowDigit.name)
    finally:
        TOOL_PARSERS.unregister(ArrowDigit.name)
    assert seen[0] == (None, "7 then", [("calculator", '{"expression": "3"}')])
    assert engine_tokens(outs) == engine.replies, "the record keeps the engine's tokens"
