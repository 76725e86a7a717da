"""``--tool-call-format compact``: ``<call>EXPRESSION</call>`` calls the calculator, the answer comes back
as ``<result>...</result>``; with a character tokenizer whose tags are single tokens (as the tiny model
of ``--task toolcalc`` has) and with one that has no letters to spell an error message."""

from __future__ import annotations

import asyncio

import plasmid_multiturn.plugin
import pytest
from plasmid_multiturn.formats import FORMATS, Compact, spellable

from plasmid.context import RolloutContext
from plasmid.protocols import ToolError
from plasmid.testing import build, make_config
from plasmid.testing.scripted import Reply, ScriptedEngine
from plasmid.types import Sample, SamplingParams, Status
from plasmid_torch.tiny import BOS_ID, EOS_ID, char_tokenizer

TAGS = ("<call>", "</call>", "<result>", "</result>")


def tokenizer(alphabet: str = "0123456789+=>*"):
    """The quickstart's kind of character tokenizer, with the compact tags as single tokens."""
    tok = char_tokenizer(alphabet)
    tok.add_tokens(list(TAGS))
    return tok


class Calculator:
    """Multiplies ``a*b``; anything else is a ToolError (what the real calculator does with nonsense)."""

    name, description = "calculator", "multiply"
    parameters = {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}

    def __init__(self):
        self.seen = []

    async def __call__(self, arguments, sample):
        self.seen.append(arguments)
        left, _, right = arguments["expression"].partition("*")
        if not (left.isdigit() and right.isdigit()):
            raise ToolError(f"cannot read {arguments['expression']!r}")
        return str(int(left) * int(right))


def run(tok, replies, tools, **options):
    config = make_config(plasmid_multiturn.plugin, generate="multiturn", tool_call_format="compact", **options)
    generate = build("generate", "multiturn", plasmid_multiturn.plugin, config=config)
    engine = ScriptedEngine([Reply(tok.encode(text, add_special_tokens=False) + tail) for text, tail in replies])
    ctx = RolloutContext(config=config, engines=[engine], data_source=None, tokenizer=tok, generate=generate,
                         rewards=None, tools={tool.name: tool for tool in tools})
    sample = Sample(prompt="123*456=", tokens=tok("123*456=")["input_ids"], index=0, group_index=0)
    params = SamplingParams(max_new_tokens=20, stop_token_ids=(EOS_ID,), seed=1)
    return asyncio.run(ctx.generate(ctx, sample, params)), engine


def test_a_compact_call_runs_the_calculator_and_its_answer_is_appended_as_a_result():
    tok, calculator = tokenizer(), Calculator()
    sample, engine = run(tok, [("<call>123*456</call>", []), ("56088", [EOS_ID])], [calculator])
    encode = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    call, result, final = encode("<call>123*456</call>"), encode("<result>56088</result>"), encode("56088")
    assert calculator.seen == [{"expression": "123*456"}]
    assert len(call) == 9 and len(result) == 7, "the tags are single tokens"
    assert sample.tokens == [BOS_ID, *encode("123*456="), *call, *result, *final, EOS_ID]
    assert sample.loss_mask == [1] * len(call) + [0] * len(result) + [1] * (len(final) + 1)
    assert sample.response == "<call>123*456</call><result>56088</result>56088"
    assert sample.status == Status.COMPLETED
    close = tok.convert_tokens_to_ids("</call>")
    assert engine.calls[0].params.stop_token_ids == (EOS_ID, close), "</call> ends the model's turn"
    assert sample.metadata["rollout_metrics"]["tool_calls_mean"] == 1.0


def test_an_error_the_tokenizer_cannot_spell_is_appended_with_the_characters_it_can():
    tok = tokenizer()  # no letters: "error: there is no tool 'calculator' ..." cannot be encoded whole
    sample, _ = run(tok, [("<call>1*2</call>", []), ("2", [EOS_ID])], [])
    assert sample.status == Status.COMPLETED
    assert sample.metadata["rollout_metrics"]["tool_errors_mean"] == 1.0
    assert sample.response == "<call>1*2</call><result></result>2"
    with pytest.raises(Exception, match="UNK"):  # what the loop would have hit without spellable()
        tok.encode("error: there is no tool", add_special_tokens=False)


def test_a_tool_error_is_told_in_full_when_the_tokenizer_can_spell_it():
    tok = tokenizer("0123456789+=>*" + "abcdefghijklmnopqrstuvwxyz :'")
    sample, _ = run(tok, [("<call>x*2</call>", []), ("0", [EOS_ID])], [Calculator()])
    assert sample.response == "<call>x*2</call><result>error: cannot read 'x*2'</result>0"


@pytest.mark.parametrize(("text", "expression"), [
    ("<call>12*34</call>", "12*34"),
    ("so <call> 2+2 </call> and then", "2+2"),
    ("<call></call>", ""),
])
def test_find_call_reads_the_first_call_as_a_calculator_expression(text, expression):
    found = Compact().find_call(text)
    assert found is not None and (found.name, found.arguments, found.error) == ("calculator",
                                                                                  {"expression": expression}, "")
    assert text[:found.end].endswith("</call>")


@pytest.mark.parametrize("text", ["12*34", "<call>12*34", "</call>", "<tool_call>{}</tool_call>"])
def test_text_without_a_complete_compact_call_has_none(text):
    assert Compact().find_call(text) is None


def test_spellable_keeps_text_a_tokenizer_encodes_whole():
    tok = tokenizer()
    assert spellable(tok, "56088") == "56088"
    assert spellable(tok, "error: 3 > 2") == "3>2"


def test_compact_is_a_tool_call_format_choice():
    assert FORMATS["compact"] is Compact
