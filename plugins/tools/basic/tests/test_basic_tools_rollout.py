"""The basic tools in a real multi-turn rollout (``--generate multiturn``) driven by the scripted
policy of :mod:`plasmid.testing.toolcalls`, in every tool-call format that can write the call: the
policy's call runs the tool, the tool's answer is in the sample with ``loss_mask`` 0 between the
policy's own tokens, and a failing call is recorded as a tool error, not a crash."""

from __future__ import annotations

import json

import plasmid_basic_tools.plugin
import pytest

from plasmid.testing.toolcalls import TOOL_CALL_FORMATS, ByteTokenizer, call_text, formats_for, run_tool_call
from plasmid.types import Status

PLUGIN = plasmid_basic_tools.plugin
#: How each format wraps a tool's answer (plasmid-multiturn's formats), ``{}`` the answer.
WRAPPING = {"tagged": "<tool_response>{}</tool_response>", "compact": "<result>{}</result>",
            "mistral": "[TOOL_RESULTS]{}[/TOOL_RESULTS]",
            "chat-template": "<|im_end|>\n<|im_start|>user\n<tool_response>\n{}\n</tool_response><|im_end|>\n"
                             "<|im_start|>assistant\n"}


def wrapped(fmt: str, answer: str) -> str:
    return WRAPPING[fmt].format(json.dumps({"content": answer}) if fmt == "mistral" else answer)


@pytest.mark.parametrize("fmt", TOOL_CALL_FORMATS)
def test_the_calculator_is_called_and_its_answer_recorded_loss_masked(fmt):
    rollout = run_tool_call(PLUGIN, "calculator", {"expression": "6*7"}, tool_call_format=fmt, answer="42!")
    sample, tok = rollout.sample, ByteTokenizer()
    call, result = call_text(fmt, "calculator", {"expression": "6*7"}), wrapped(fmt, "42")
    assert sample.status == Status.COMPLETED
    assert sample.response == call + result + "42!"
    lengths = [len(tok.encode(part)) for part in (call, result, "42!")]
    assert sample.loss_mask == [1] * lengths[0] + [0] * lengths[1] + [1] * (lengths[2] + 1)  # + EOS
    assert rollout.outputs == [result]
    assert rollout.metrics["tool_calls_mean"] == 1.0 and rollout.metrics["tool_errors_mean"] == 0.0
    assert rollout.metrics["turns_mean"] == 2.0
    second = rollout.requests[1].prompt_ids
    assert second == sample.tokens[:len(second)], "each turn's prompt extends the sample token for token"


@pytest.mark.parametrize("fmt", formats_for("retrieve", {"query": "x"}))
def test_retrieve_finds_a_document_in_every_format_that_can_name_it(fmt, tmp_path):
    docs = tmp_path / "docs.txt"
    docs.write_text("Paris is the capital of France.\n\nThe Nile is a river in Africa.\n")
    rollout = run_tool_call(PLUGIN, "retrieve", {"query": "capital of France", "k": 1}, tool_call_format=fmt,
                            retrieve_docs=docs)
    assert rollout.tool.name == "retrieve" and rollout.metrics["tool_errors_mean"] == 0.0
    [output] = rollout.outputs
    assert "Paris is the capital of France." in output and "Nile" not in output
    assert rollout.sample.response.endswith(output + "done")


def test_compact_cannot_name_any_tool_but_the_calculator(tmp_path):
    assert "compact" not in formats_for("retrieve", {"query": "x"})
    docs = tmp_path / "docs.txt"
    docs.write_text("a document\n")
    with pytest.raises(ValueError, match="compact can only call calculator"):
        run_tool_call(PLUGIN, "retrieve", {"query": "x"}, tool_call_format="compact", retrieve_docs=docs)


@pytest.mark.parametrize("fmt", ["tagged", "mistral"])
def test_failing_calls_are_recorded_as_tool_errors_turn_after_turn(fmt):
    rollout = run_tool_call(PLUGIN, "calculator", {"expression": "6*"}, tool_call_format=fmt, calls=2,
                            calculator_max_length=100)
    assert rollout.sample.status == Status.COMPLETED
    assert rollout.metrics["tool_calls_mean"] == 2.0 and rollout.metrics["tool_errors_mean"] == 2.0
    assert len(rollout.outputs) == 2 and all("error: " in output for output in rollout.outputs)


def test_the_tools_options_reach_the_tool():
    rollout = run_tool_call(PLUGIN, "calculator", {"expression": "123456*2"}, calculator_max_length=3)
    assert rollout.metrics["tool_errors_mean"] == 1.0 and "error: " in rollout.outputs[0]


def test_a_too_long_answer_is_cut_by_the_rollout_as_in_a_run():
    rollout = run_tool_call(PLUGIN, "calculator", {"expression": "7**40"}, tool_max_output_chars=5)
    assert rollout.outputs == [wrapped("tagged", f"{str(7 ** 40)[:5]} [cut: the answer had 34 characters, "
                                                 f"the limit is 5]")]


def test_a_hugging_face_tokenizer_whose_closing_tag_is_one_token_ends_the_turn_there():
    pytest.importorskip("transformers")
    from plasmid_torch.tiny import char_tokenizer

    tok = char_tokenizer("0123456789*=")  # the quickstart's kind: no letters
    tok.add_tokens(["<call>", "</call>", "<result>", "</result>"])
    rollout = run_tool_call(PLUGIN, "calculator", {"expression": "6*7"}, tool_call_format="compact", tokenizer=tok,
                            prompt="6*7=", answer="42")
    assert rollout.sample.response == "<call>6*7</call><result>42</result>42"
    assert rollout.sample.status == Status.COMPLETED and rollout.outputs == ["<result>42</result>"]
    assert tok.convert_tokens_to_ids("</call>") in rollout.requests[0].params.stop_token_ids
