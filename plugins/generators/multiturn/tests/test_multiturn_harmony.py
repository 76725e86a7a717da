"""``--tool-call-format harmony``: a gpt-oss-style conversation (OpenAI's harmony) continued turn by
turn with a real Hugging Face tokenizer whose harmony markers are special tokens and whose chat
template is a small harmony template built here: calls read by the shared ``openai`` parser, each
answer appended as a harmony tool message (loss-masked), the tokens exactly the engine's and the
format's, and the whole conversation the one the template renders (a round trip)."""

from __future__ import annotations

import asyncio
import json
import string

import plasmid_multiturn.plugin
import pytest
from plasmid_multiturn.formats import FORMATS, Harmony

from plasmid.context import RolloutContext
from plasmid.errors import UsageError
from plasmid.protocols import ToolError
from plasmid.testing import build, make_config
from plasmid.testing.scripted import Reply, ScriptedEngine
from plasmid.types import Sample, SamplingParams, Status
from plasmid_serving.parsers.harmony import Harmony as HarmonyParser

MARKERS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|call|>", "<|return|>"]

#: A small harmony chat template (the shape of gpt-oss's, without its system boilerplate): the tools in
#: a developer message; a user turn ``<|start|>user<|message|>...<|end|>``; an assistant turn's
#: ``thinking`` as an ``analysis`` message, its tool call as a ``commentary`` message to=functions.NAME
#: closed by ``<|call|>``, its content as a ``final`` message (closed by ``<|return|>`` when it ends the
#: conversation); a tool answer as ``<|start|>functions.NAME to=assistant<|channel|>commentary...<|end|>``.
TEMPLATE = (
    "{%- if tools %}<|start|>developer<|message|>functions: {{ tools | map(attribute='function') "
    "| map(attribute='name') | join(',') }}<|end|>{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}"
    "{%- if m.thinking %}<|start|>assistant<|channel|>analysis<|message|>{{ m.thinking }}<|end|>{%- endif %}"
    "{%- for c in m.tool_calls or [] %}<|start|>assistant<|channel|>commentary to=functions.{{ c.function.name }}"
    " <|constrain|>json<|message|>{{ c.function.arguments | tojson }}<|call|>{%- endfor %}"
    "{%- if m.content %}<|start|>assistant<|channel|>final<|message|>{{ m.content }}"
    "{%- if loop.last %}<|return|>{%- else %}<|end|>{%- endif %}{%- endif %}"
    "{%- elif m.role == 'tool' %}<|start|>functions.{{ m.name }} to=assistant<|channel|>commentary<|message|>"
    "{{ m.content }}<|end|>"
    "{%- else %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|start|>assistant{% endif %}"
)


def harmony_tokenizer():
    """The tiny char tokenizer over printable ASCII with harmony's markers as special tokens."""
    pytest.importorskip("transformers")
    from plasmid_torch.tiny import char_tokenizer

    alphabet = "".join(c for c in string.printable if c not in "\n\r\t\x0b\x0c")
    tok = char_tokenizer(alphabet, max_length=4096)
    tok.add_special_tokens({"additional_special_tokens": MARKERS})
    tok.chat_template = TEMPLATE
    return tok


class Add:
    name, description = "add", "Add two integers."
    parameters = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                  "required": ["a", "b"]}

    def __init__(self):
        self.seen = []

    async def __call__(self, arguments, sample):
        self.seen.append(arguments)
        if not all(isinstance(arguments.get(k), int) for k in "ab"):
            raise ToolError("a and b must be integers")
        return json.dumps({"sum": arguments["a"] + arguments["b"]})


def encode(tok, text):
    return tok.encode(text, add_special_tokens=False)


def run(tok, replies, tool):
    config = make_config(plasmid_multiturn.plugin, generate="multiturn", tool_call_format="harmony")
    generate = build("generate", "multiturn", plasmid_multiturn.plugin, config=config)
    engine = ScriptedEngine(replies)
    ctx = RolloutContext(config=config, engines=[engine], data_source=None, tokenizer=tok, generate=generate,
                         rewards=None, tools={"add": tool})
    sample = Sample(prompt=[{"role": "user", "content": "2+3?"}], tokens=[1, 2, 3], index=0, group_index=0)
    params = SamplingParams(max_new_tokens=200, stop_token_ids=(tok.convert_tokens_to_ids("<|return|>"),))
    return asyncio.run(generate(ctx, sample, params)), engine


THINK = "<|channel|>analysis<|message|>add them<|end|>"
CALL = '<|start|>assistant<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a": 2, "b": 3}<|call|>'
FINAL = "<|channel|>final<|message|>5<|return|>"


@pytest.mark.timeout(120)
def test_a_harmony_conversation_round_trips_through_the_template_with_the_tool_turn_masked():
    tok, add = harmony_tokenizer(), Add()
    first, second = encode(tok, THINK + CALL), encode(tok, FINAL)
    sample, engine = run(tok, [Reply(first), Reply(second)], add)

    tools = [{"type": "function", "function": {"name": "add", "description": Add.description,
                                               "parameters": Add.parameters}}]
    prompt_text = tok.apply_chat_template([{"role": "user", "content": "2+3?"}], tools=tools,
                                          add_generation_prompt=True, tokenize=False)
    assert prompt_text == "<|start|>developer<|message|>functions: add<|end|><|start|>user<|message|>2+3?<|end|>" \
                          "<|start|>assistant"
    prompt_ids = encode(tok, prompt_text)
    appended = encode(tok, '<|start|>functions.add to=assistant<|channel|>commentary<|message|>{"sum": 5}<|end|>'
                           "<|start|>assistant")
    assert add.seen == [{"a": 2, "b": 3}], "the call, read by the openai (harmony) parser"
    assert sample.tokens == prompt_ids + first + appended + second, "the engine's tokens and the format's, as they are"
    assert sample.loss_mask == [1] * len(first) + [0] * len(appended) + [1] * len(second)
    assert sample.rollout_logprobs == [-0.5] * len(first) + [0.0] * len(appended) + [-0.5] * len(second)
    assert [c.prompt_ids for c in engine.calls] == [prompt_ids, prompt_ids + first + appended]
    assert engine.calls[0].params.stop_token_ids[-1] == tok.convert_tokens_to_ids("<|call|>"), \
        "<|call|> ends the model's turn"
    assert sample.status == Status.COMPLETED
    assert sample.metadata["rollout_metrics"]["tool_calls_mean"] == 1.0
    assert sample.metadata["rollout_metrics"]["tool_errors_mean"] == 0.0

    # the round trip: the template renders the same conversation to the same tokens
    whole = tok.apply_chat_template(
        [{"role": "user", "content": "2+3?"},
         {"role": "assistant", "thinking": "add them", "content": "",
          "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]},
         {"role": "tool", "name": "add", "content": '{"sum": 5}'},
         {"role": "assistant", "content": "5"}], tools=tools, tokenize=False)
    assert encode(tok, whole) == sample.tokens
    # and the shared parser reads the model's turns back: the call, then the answer
    turns = tok.decode(first, skip_special_tokens=False), tok.decode(second, skip_special_tokens=False)
    parser = HarmonyParser()
    content, calls = parser.parse(turns[0])
    assert content is None and [call["function"] for call in calls] == [{"name": "add",
                                                                        "arguments": '{"a": 2, "b": 3}'}]
    assert parser.parse(turns[1]) == ("5", [])


@pytest.mark.timeout(120)
def test_a_malformed_harmony_call_is_answered_with_its_error_and_the_conversation_goes_on():
    tok, add = harmony_tokenizer(), Add()
    bad = encode(tok, "<|channel|>commentary to=functions.add <|constrain|>json<|message|>{a: 2}<|call|>")
    sample, engine = run(tok, [Reply(bad), Reply(encode(tok, FINAL))], add)
    assert add.seen == [] and len(engine.calls) == 2
    answer = tok.decode(sample.response_tokens[len(bad):], skip_special_tokens=False)
    assert answer.startswith("<|start|>functions. to=assistant<|channel|>commentary<|message|>error: the tool "
                             "call's arguments are not valid JSON")
    assert sample.metadata["rollout_metrics"]["tool_errors_mean"] == 1.0


def test_harmony_is_a_format_and_needs_a_chat_template():
    assert FORMATS["harmony"] is Harmony
    tok = harmony_tokenizer()
    tok.chat_template = None
    with pytest.raises(UsageError, match="^--tool-call-format harmony: the tokenizer has no chat template"):
        run(tok, [Reply([2])], Add())
