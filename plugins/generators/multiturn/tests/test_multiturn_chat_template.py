"""``--tool-call-format chat-template`` with a real Hugging Face tokenizer and chat template (built
in code): rendered turn by turn, only the appended text is encoded, and a template that rewrites
the history is reported, never re-tokenised."""

from __future__ import annotations

import asyncio
import json
import string

import plasmid_multiturn.plugin
import pytest

from plasmid.context import RolloutContext
from plasmid.errors import UsageError
from plasmid.protocols import ToolError
from plasmid.testing import build, make_config
from plasmid.testing.scripted import Reply, ScriptedEngine
from plasmid.types import Sample, SamplingParams, Status

TEMPLATE = (
    "{%- if tools %}<|im_start|>system tools: {{ tools | map(attribute='function') | map(attribute='name') "
    "| join(',') }}<|im_end|>{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}<|im_start|>user <tool_response>{{ m.content }}</tool_response><|im_end|>"
    "{%- elif m.role == 'assistant' %}<|im_start|>assistant {{ m.content | replace(REWRITE, '') }}<|im_end|>"
    "{%- else %}<|im_start|>{{ m.role }} {{ m.content }}<|im_end|>{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant {% endif %}"
)


def tokenizer(rewrite: str = "\x00"):
    pytest.importorskip("transformers")
    from plasmid_torch.tiny import char_tokenizer

    alphabet = "".join(c for c in string.printable if c not in "\n\r\t\x0b\x0c")
    tok = char_tokenizer(alphabet, max_length=4096)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = TEMPLATE.replace("REWRITE", json.dumps(rewrite))
    return tok


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
def test_the_conversation_is_the_templates_rendering_built_from_the_engines_tokens():
    tok = tokenizer()
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
def test_a_template_that_rewrites_the_history_ends_the_conversation_and_is_reported():
    tok = tokenizer(rewrite="so ")   # drops "so " from earlier assistant turns, as reasoning strippers do
    first = encode(tok, "so " + CALL)
    sample, engine, _ = run(tok, [Reply(first), Reply(encode(tok, "never"))])
    assert len(engine.calls) == 1 and sample.response_tokens == first
    assert sample.status == Status.COMPLETED
    assert "renders turn 1's history differently" in sample.metadata["multiturn"]["mismatch"]
    assert sample.metadata["rollout_metrics"]["template_mismatch_fraction"] == 1.0


def test_a_tokenizer_without_a_chat_template_is_a_one_line_usage_error():
    tok = tokenizer()
    tok.chat_template = None
    with pytest.raises(UsageError, match="--tool-call-format chat-template: the tokenizer has no chat template"):
        run(tok, [Reply([2])])
