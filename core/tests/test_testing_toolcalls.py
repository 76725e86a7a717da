"""``plasmid.testing.toolcalls`` without any plugin: the call text of each tool-call format, the byte
tokenizer and its chat template, and the scripted policy telling the turns of concurrent
conversations apart by their prompts (the rollouts themselves, through plasmid-multiturn, are
tested with the basic tools in plugins/tools/basic/tests/test_basic_tools_rollout.py)."""

from __future__ import annotations

import json

import pytest

from plasmid.testing import run
from plasmid.testing.scripted import ScriptedEngine
from plasmid.testing.toolcalls import (
    TOOL_CALL_FORMATS,
    ByteTokenizer,
    ToolCallPolicy,
    call_text,
    formats_for,
    masked_outputs,
)
from plasmid.types import Sample, SamplingParams, Status

ARGS = {"text": "a \"quoted\" é"}


@pytest.mark.parametrize(("fmt", "opening", "closing"), [
    ("tagged", "<tool_call>", "</tool_call>"), ("chat-template", "<tool_call>", "</tool_call>"),
    ("mistral", "[TOOL_CALLS][", "]")])
def test_json_formats_write_the_name_and_arguments(fmt, opening, closing):
    text = call_text(fmt, "my-tool", ARGS)
    assert text.startswith(opening) and text.endswith(closing)
    assert json.loads(text[len(opening):-len(closing)]) == {"name": "my-tool", "arguments": ARGS}


def test_compact_writes_the_calculator_expression_and_refuses_other_calls():
    assert call_text("compact", "calculator", {"expression": "6*7"}) == "<call>6*7</call>"
    assert formats_for("calculator", {"expression": "6*7"}) == TOOL_CALL_FORMATS
    assert "compact" not in formats_for("my-tool", ARGS)
    assert "compact" not in formats_for("calculator", {"expression": "1", "precision": 2})
    with pytest.raises(ValueError, match="compact can only call calculator.*use tagged, chat-template, mistral"):
        call_text("compact", "my-tool", ARGS)
    with pytest.raises(ValueError, match="unknown tool-call format 'hermes'"):
        call_text("hermes", "my-tool", ARGS)


def test_the_byte_tokenizer_round_trips_any_text_and_ends_with_eos():
    tok = ByteTokenizer()
    text = 'ünïcode {"x": 1} <tool_call>\n'
    ids = tok.encode(text, add_special_tokens=False)
    assert all(0 <= i < 256 for i in ids) and tok.decode(ids) == text
    assert tok.decode([*ids, tok.eos_token_id]) == text + "<|endoftext|>"
    assert tok.decode([*ids, tok.eos_token_id], skip_special_tokens=True) == text
    assert tok.decode(ids[:1]) == "\ufffd"  # the first of the two bytes of "ü"


def test_the_chat_template_extends_its_previous_rendering():
    tok = ByteTokenizer()
    tools = [{"type": "function", "function": {"name": "my-tool", "description": "d", "parameters": {}}}]
    messages = [{"role": "user", "content": "hi"}]
    first = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    assert '"name": "my-tool"' in first and first.endswith("<|im_start|>assistant\n")
    turn = call_text("chat-template", "my-tool", ARGS)
    later = tok.apply_chat_template([*messages, {"role": "assistant", "content": turn},
                                     {"role": "tool", "name": "my-tool", "content": "ANSWER"}],
                                    tools=tools, add_generation_prompt=True, tokenize=False)
    assert later.startswith(first + turn) and "<tool_response>\nANSWER\n</tool_response>" in later
    assert tok.apply_chat_template(messages) == tok.encode(tok.apply_chat_template(messages, tokenize=False))


def test_the_policy_calls_then_answers_and_keeps_concurrent_conversations_apart():
    tok = ByteTokenizer()
    policy = ToolCallPolicy(tok, [("my-tool", ARGS), ("my-tool", {"text": "b"})], "tagged", answer="ok")
    engine = ScriptedEngine(policy)
    params = SamplingParams(max_new_tokens=policy.longest_reply, stop_token_ids=(tok.eos_token_id,))
    first, other = tok.encode("first"), tok.encode("other")

    async def talk():
        a1 = await engine.generate(first, params)
        b1 = await engine.generate(other, params)  # another conversation starts: its first call again
        a_so_far = first + a1.token_ids + tok.encode("<tool_response>x</tool_response>")
        a2 = await engine.generate(a_so_far, params)
        a3 = await engine.generate(a_so_far + a2.token_ids + tok.encode("<tool_response>y</tool_response>"), params)
        return a1, b1, a2, a3

    a1, b1, a2, a3 = run(talk())
    assert tok.decode(a1.token_ids) == call_text("tagged", "my-tool", ARGS) == tok.decode(b1.token_ids)
    assert tok.decode(a2.token_ids) == call_text("tagged", "my-tool", {"text": "b"})
    assert a3.token_ids == [*tok.encode("ok"), tok.eos_token_id] and a3.status == Status.COMPLETED
    assert a1.logprobs == [-0.5] * len(a1.token_ids)


def test_masked_outputs_are_the_runs_the_policy_did_not_write():
    tok = ByteTokenizer()
    response = tok.encode("call") + tok.encode("R1") + tok.encode("more") + tok.encode("R2")
    sample = Sample(prompt="p", tokens=tok.encode("p") + response, response_length=len(response),
                    loss_mask=[1] * 4 + [0] * 2 + [1] * 4 + [0] * 2)
    assert masked_outputs(sample, tok) == ["R1", "R2"]
