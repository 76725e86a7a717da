"""``--tool-call-format chat-template`` with a real Hugging Face tokenizer and chat template (built
in code, the ``chat_tokenizer`` fixture of conftest.py): rendered turn by turn, only the appended
text is encoded, and a template that rewrites the history or raises on a tool turn is reported,
never re-tokenised, and does not crash the rollout."""

from __future__ import annotations

import asyncio

import plasmid_multiturn.plugin
import pytest

from plasmid.context import RolloutContext
from plasmid.errors import UsageError
from plasmid.protocols import ToolError
from plasmid.testing import build, make_config
from plasmid.testing.scripted import Reply, ScriptedEngine
from plasmid.types import Sample, SamplingParams, Status


class Add:
    name, description = "add", "Add two integers."
    parameters = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                  "required": ["a", "b"]}

    async def __call__(self, arguments, sample):
        if not all(isinstance(arguments.get(k), int) for k in "ab"):
            raise ToolError("a and b must be integers")
        return str(arguments["a"] + arguments["b"])


def run(tok, replies, prompt="2+3?"):
    config = make_config(plasmid_multiturn.plugin, generate="multiturn", tool_call_format="chat-template")
    generate = build("generate", "multiturn", plasmid_multiturn.plugin, config=config)
    engine = ScriptedEngine(replies)
    ctx = RolloutContext(config=config, engines=[engine], data_source=None, tokenizer=tok, generate=generate,
                         rewards=None, tools={"add": Add()})
    end = tok.convert_tokens_to_ids("<|im_end|>")
    sample = Sample(prompt=prompt, tokens=[1, 2, 3], index=0, group_index=0)
    done = asyncio.run(generate(ctx, sample, SamplingParams(max_new_tokens=200, stop_token_ids=(end,))))
    return done, engine, end


def encode(tok, text):
    return tok.encode(text, add_special_tokens=False)


CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'


@pytest.mark.timeout(120)
def test_the_conversation_is_the_templates_rendering_built_from_the_engines_tokens(chat_tokenizer):
    tok = chat_tokenizer()
    end = tok.convert_tokens_to_ids("<|im_end|>")
    first, second = encode(tok, "so " + CALL), encode(tok, "it is 5") + [end]
    sample, engine, _ = run(tok, [Reply(first + encode(tok, " more")), Reply(second)])
    tools = [{"type": "function", "function": {"name": "add", "description": Add.description,
                                               "parameters": Add.parameters}}]
    prompt_text = tok.apply_chat_template([{"role": "user", "content": "2+3?"}], tools=tools,
                                          add_generation_prompt=True, tokenize=False)
    assert prompt_text == "<|im_start|>system tools: add<|im_end|><|im_start|>user 2+3?<|im_end|><|im_start|>assistant "
    prompt_ids = encode(tok, prompt_text)
    appended = encode(tok, "<|im_end|><|im_start|>user <tool_response>5</tool_response><|im_end|>"
                           "<|im_start|>assistant ")
    assert sample.tokens == prompt_ids + first + appended + second
    assert sample.loss_mask == [1] * len(first) + [0] * len(appended) + [1] * len(second)
    assert [c.prompt_ids for c in engine.calls] == [prompt_ids, prompt_ids + first + appended]
    assert sample.status == Status.COMPLETED
    whole = tok.apply_chat_template([{"role": "user", "content": "2+3?"},
                                     {"role": "assistant", "content": "so " + CALL},
                                     {"role": "tool", "content": "5"},
                                     {"role": "assistant", "content": "it is 5"}], tools=tools, tokenize=False)
    assert tok.decode(sample.tokens, skip_special_tokens=False) == whole
    assert sample.metadata["rollout_metrics"]["template_mismatch_fraction"] == 0.0


@pytest.mark.timeout(120)
def test_a_template_that_rewrites_the_history_ends_the_conversation_and_is_reported(chat_tokenizer):
    tok = chat_tokenizer(rewrite="so ")   # drops "so " from earlier assistant turns, as reasoning strippers do
    first = encode(tok, "so " + CALL)
    sample, engine, _ = run(tok, [Reply(first), Reply(encode(tok, "never"))])
    assert len(engine.calls) == 1 and sample.response_tokens == first
    assert sample.status == Status.COMPLETED
    assert "renders turn 1's history differently" in sample.metadata["multiturn"]["mismatch"]
    assert sample.metadata["rollout_metrics"]["template_mismatch_fraction"] == 1.0


@pytest.mark.timeout(120)
def test_a_template_that_raises_on_the_tool_turn_ends_the_conversation_and_is_reported(chat_tokenizer):
    """A template that rejects the format's tool message (no ``tool_call_id``) ends the sample as a
    history rewrite does, instead of crashing the rollout; the prompt still renders."""
    tok = chat_tokenizer(require_tool_call_id=True)
    first = encode(tok, "so " + CALL)
    sample, engine, _ = run(tok, [Reply(first), Reply(encode(tok, "never"))])
    assert len(engine.calls) == 1 and sample.response_tokens == first and sample.loss_mask == [1] * len(first)
    assert sample.status == Status.COMPLETED
    state = sample.metadata["multiturn"]
    assert state["mismatch"] == ("the chat template cannot render turn 1's tool answer: TemplateError: tool messages "
                                 "need a tool_call_id")
    assert state["tool_calls"] == 1 and state["messages"] == [{"role": "user", "content": "2+3?"}]
    assert sample.metadata["rollout_metrics"]["template_mismatch_fraction"] == 1.0


def test_a_tokenizer_without_a_chat_template_is_a_one_line_usage_error(chat_tokenizer):
    tok = chat_tokenizer()
    tok.chat_template = None
    with pytest.raises(UsageError, match="--tool-call-format chat-template: the tokenizer has no chat template"):
        run(tok, [Reply([2])])
