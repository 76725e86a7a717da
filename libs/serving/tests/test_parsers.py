"""The parser registry (built-in names, a third-party package's entry point, in-process registration,
clashes and bad names), the options, and each parser's behaviour on malformed and unfinished text:
total (never raises), a malformed call stays in the content, and a call found in a prefix of a text
is found in every longer text."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from plasmid.errors import PluginError, UsageError
from plasmid_serving.parsers import REASONING_PARSERS, TOOL_PARSERS, CallSpan, ToolCall, ToolParser, parse_message
from plasmid_serving.parsers.options import ParserOptions

VLLM_TOOL_NAMES = ["hermes", "llama3_json", "mistral", "deepseek_v3", "qwen3_coder", "pythonic"]


def names_and_arguments(calls):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


# ---------------------------------------------------------------------------------- the registry
def test_the_built_in_parsers_have_vllm_and_sglang_names():
    assert set(VLLM_TOOL_NAMES + ["qwen25", "llama3", "deepseekv3"]) <= set(TOOL_PARSERS.names())
    assert {"deepseek_r1", "deepseek-r1", "qwen3"} <= set(REASONING_PARSERS.names())
    assert type(TOOL_PARSERS.get("qwen25")) is type(TOOL_PARSERS.get("hermes"))


def test_an_unknown_name_is_a_one_line_usage_error_listing_the_choices():
    with pytest.raises(UsageError, match=r"^--tool-parser 'hermess': choose one of .*hermes.*plasmid.tool_parsers"):
        TOOL_PARSERS.get("hermess")
    with pytest.raises(UsageError, match=r"^--reasoning-parser 'r1': choose one of deepseek-r1, deepseek_r1"):
        REASONING_PARSERS.get("r1")


class Bracketed(ToolParser):
    """A third-party syntax: ``{{NAME}}`` calls NAME without arguments."""

    name = "bracketed"

    def spans(self, text, tools=None):
        import re

        return [CallSpan(m.start(), m.end(), (ToolCall(m.group(1), {}),)) for m in re.finditer(r"\{\{(\w+)\}\}", text)]


def test_a_parser_registered_in_process_is_used_and_its_name_cannot_be_taken_twice():
    TOOL_PARSERS.register("bracketed", Bracketed, origin="this test")
    try:
        assert parse_message("go {{ping}} now", TOOL_PARSERS.get("bracketed")).content == "go  now"
        assert names_and_arguments(TOOL_PARSERS.get("bracketed").parse("{{ping}}")[1]) == [("ping", {})]
        with pytest.raises(PluginError, match="'bracketed' is already registered by this test"):
            TOOL_PARSERS.register("bracketed", Bracketed)
        with pytest.raises(PluginError, match="'hermes' is already registered by plasmid-serving"):
            TOOL_PARSERS.register("hermes", Bracketed)
    finally:
        TOOL_PARSERS.unregister("bracketed")
    assert "bracketed" not in TOOL_PARSERS.names()


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """``installed(dist, entry_points, module_source)``: a package installed on ``sys.path`` for this
    test (a ``.dist-info`` with ``entry_points.txt`` beside its module), as pip would leave it."""

    def install(dist: str, entry_points: str, module: str, source: str) -> None:
        info = tmp_path / f"{dist.replace('-', '_')}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.delitem(sys.modules, module, raising=False)

    return install


def test_a_third_party_package_adds_parsers_through_its_entry_points(installed):
    installed("rl-parsers-xyz", """
        [plasmid.tool_parsers]
        angle = rl_parsers_xyz:Angle
        [plasmid.reasoning_parsers]
        notes = rl_parsers_xyz:Notes
        """, "rl_parsers_xyz", """
        import re
        from plasmid_serving.parsers import CallSpan, ToolCall, ToolParser

        class Angle(ToolParser):
            name = "angle"
            def spans(self, text, tools=None):
                return [CallSpan(m.start(), m.end(), (ToolCall(m.group(1), {"x": int(m.group(2))}),))
                        for m in re.finditer(r"<<(\\w+) (\\d+)>>", text)]

        class Notes:
            def split(self, text):
                head, sep, tail = text.partition("||")
                return (head, len(head) + 2) if sep else (None, 0)
        """)
    assert "angle" in TOOL_PARSERS.names() and "notes" in REASONING_PARSERS.names()
    options = ParserOptions.from_values({"tool_parser": "angle", "reasoning_parser": "notes"})
    parsed = parse_message("<<no 1>> thinking || done <<add 7>>", options.tool(), options.reasoning())
    assert parsed.reasoning == "<<no 1>> thinking"  # a call inside the reasoning is not a call
    assert parsed.content == "done"
    assert names_and_arguments(parsed.tool_calls) == [("add", {"x": 7})]


def test_a_package_that_takes_a_built_in_name_or_breaks_is_named(installed):
    installed("bad-parsers", """
        [plasmid.tool_parsers]
        mistral = bad_parsers:Other
        """, "bad_parsers", "Other = None\n")
    with pytest.raises(PluginError, match="'mistral' is given by both plasmid-serving .* and package bad-parsers"):
        TOOL_PARSERS.names()


def test_a_broken_or_wrong_parser_package_is_named_when_chosen(installed):
    installed("broken-parsers", """
        [plasmid.tool_parsers]
        broken = broken_parsers:Missing
        notaparser = broken_parsers:Plain
        """, "broken_parsers", "class Plain:\n    pass\n")
    with pytest.raises(PluginError, match="tool parser 'broken' of package broken-parsers cannot be loaded: "
                                          "AttributeError"):
        TOOL_PARSERS.get("broken")
    with pytest.raises(PluginError, match="'notaparser' of package broken-parsers has no spans\\(\\) method"):
        TOOL_PARSERS.get("notaparser")


# ---------------------------------------------------------------------------------- options
def test_options_default_to_no_parser_and_refuse_an_unknown_name_naming_the_flag():
    defaults = ParserOptions.defaults()
    assert (defaults.tool_parser, defaults.reasoning_parser, defaults.tool(), defaults.reasoning()) == (
        None, None, None, None)
    with pytest.raises(UsageError, match="^--tool-parser 'gpt'"):
        ParserOptions.from_values({"tool_parser": "gpt"})
    with pytest.raises(UsageError, match="^--reasoning-parser 'think'"):
        ParserOptions.from_values({"reasoning_parser": "think"})


# ---------------------------------------------------------------------------------- malformed text
MALFORMED = {
    "hermes": ['<tool_call>{"name": "f", "arguments": {</tool_call>', "<tool_call>[1]</tool_call>",
               '<tool_call>{"name": "f", "arguments": 3}</tool_call>', '<tool_call>{"name": "f"'],
    "llama3_json": ['<|python_tag|>{"parameters": {}}', '{"name": "f", "parameters": {"a": ', "<|python_tag|>[1]"],
    "mistral": ["[TOOL_CALLS][]", "[TOOL_CALLS] 12", "[TOOL_CALLS]f g", '[TOOL_CALLS][{"name": "f"',
                "[TOOL_CALLS]f[ARGS]nope", '[TOOL_CALLS][{"arguments": {}}]'],
    "deepseek_v3": ["<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n{}<｜tool▁call▁end｜>",
                    "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{bad\n```<｜tool▁call▁end｜>",
                    "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}"],
    "qwen3_coder": ["<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</tool_call>",
                    "<tool_call>{\"name\": \"f\"}</tool_call>", "<tool_call>\n<function=f>\n"],
    "pythonic": ["[f(1)]", "[f(x=g())]", "[f(x=1)", "[1, 2]", "[f(x=1), 3]"],
}


@pytest.mark.parametrize(("name", "text"), [(n, t) for n, texts in MALFORMED.items() for t in texts])
def test_a_malformed_or_unfinished_call_stays_in_the_content_and_nothing_raises(name, text):
    parser = TOOL_PARSERS.get(name)
    for prefix in (text[:i] for i in range(len(text) + 1)):
        content, calls = parser.parse("before " + prefix)
        assert calls == [] and content == "before " + prefix


@pytest.mark.parametrize(("name", "text", "error"), [
    ("hermes", "<tool_call>{nope}</tool_call>", "not valid JSON"),
    ("mistral", "[TOOL_CALLS][]", "empty list"),
    ("mistral", "[TOOL_CALLS] 12", "is followed by a JSON list"),
    ("mistral", "[TOOL_CALLS]calc x", "[TOOL_CALLS]calc is followed by [ARGS]"),
    ("deepseek_v3", "<｜tool▁call▁begin｜>f<｜tool▁call▁end｜>", "```json block"),
    ("qwen3_coder", "<tool_call>oops</tool_call>", "<function=NAME>"),
])
def test_a_malformed_call_is_a_span_with_a_reason_for_the_model(name, text, error):
    (span,) = TOOL_PARSERS.get(name).spans(text)
    assert not span.ok and error in (span.error or span.calls[0].error)


WELL_FORMED = {
    "hermes": 'a <tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call> b',
    "llama3_json": '<|python_tag|>{"name": "f", "parameters": {"x": 1}}; {"name": "g", "parameters": {}} b',
    "mistral": '[TOOL_CALLS]f[CALL_ID]a1B2c3D4e[ARGS]{"x": 1}[TOOL_CALLS]g[ARGS]{} b',
    "deepseek_v3": ("a<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"x\": 1}\n```"
                    "<｜tool▁call▁end｜><｜tool▁calls▁end｜> b"),
    "qwen3_coder": "a <tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call> b",
    "pythonic": '[f(x=1), g(s="]")] b',
}
#: What each text of WELL_FORMED leaves as content, and how many calls it holds.
LEFT = {"hermes": ("a  b", 1), "llama3_json": ("b", 2), "mistral": ("b", 2), "deepseek_v3": ("a b", 1),
        "qwen3_coder": ("a  b", 1), "pythonic": ("b", 2)}


@pytest.mark.parametrize("name", sorted(WELL_FORMED))
def test_a_call_found_in_a_prefix_is_found_in_every_longer_text(name):
    parser, text = TOOL_PARSERS.get(name), WELL_FORMED[name]
    first = None
    for i in range(len(text) + 1):
        spans = parser.spans(text[:i])
        if first is None and spans:
            first = spans[0].calls[0]
        elif first is not None:
            assert spans and spans[0].calls[0] == first, text[:i]
    assert first == ToolCall("f", {"x": 1})
    content, calls = parser.parse(text)
    assert (content, len(calls)) == LEFT[name] and names_and_arguments(calls)[0] == ("f", {"x": 1})


def test_content_keeps_the_text_around_the_calls_and_is_none_when_only_calls():
    hermes = TOOL_PARSERS.get("hermes")
    assert hermes.parse('<tool_call>{"name": "f"}</tool_call>\n')[0] is None
    assert hermes.parse("no calls here\n") == ("no calls here\n", [])


# ---------------------------------------------------------------------------------- reasoning
@pytest.mark.parametrize(("name", "text", "reasoning", "content"), [
    ("qwen3", "<think>\nplan\n</think>\n\nanswer", "plan", "answer"),
    ("qwen3", "plan</think>answer", "plan", "answer"),        # the prompt opened <think>
    ("qwen3", "just an answer", None, "just an answer"),     # thinking off
    ("qwen3", "<think>cut short", "cut short", None),
    ("deepseek_r1", "plan\n</think>\n\nanswer", "plan", "answer"),
    ("deepseek_r1", "still thinking", "still thinking", None),
    ("deepseek-r1", "<think>a</think>b</think>c", "a", "b</think>c"),
])
def test_think_tags_split_reasoning_from_content(name, text, reasoning, content):
    parsed = parse_message(text, None, REASONING_PARSERS.get(name))
    assert (parsed.reasoning, parsed.content) == (reasoning, content)


def test_a_call_inside_the_reasoning_is_not_a_call():
    text = '<think><tool_call>{"name": "f"}</tool_call></think><tool_call>{"name": "g"}</tool_call>'
    parsed = parse_message(text, TOOL_PARSERS.get("hermes"), REASONING_PARSERS.get("qwen3"))
    assert [c["function"]["name"] for c in parsed.tool_calls] == ["g"] and parsed.content is None


# ---------------------------------------------------------------------------------- harmony (gpt-oss)
#: How gpt-oss writes a call itself: the recipient in the channel header, the content type constrained.
HARMONY_CALL = ("<|channel|>analysis<|message|>Use f.<|end|><|start|>assistant<|channel|>commentary "
                "to=functions.f <|constrain|>json<|message|>{\"x\": 1}<|call|>")


def test_harmony_calls_in_either_header_form_are_final_spans():
    harmony = TOOL_PARSERS.get("openai")
    (span,) = harmony.spans(HARMONY_CALL)
    assert span.ok and span.final and span.calls == (ToolCall("f", {"x": 1}),)
    assert HARMONY_CALL[span.start:span.end].startswith("<|start|>assistant<|channel|>commentary to=")
    rendered = "<|start|>assistant to=functions.g<|channel|>commentary json<|message|>{}<|call|>"
    assert [s.calls for s in harmony.spans("<|channel|>commentary<|message|>Checking.<|end|>" + rendered)] == [
        (ToolCall("g", {}),)]
    assert harmony.parse("<|channel|>commentary<|message|>Checking.<|end|>" + rendered)[0] == "Checking."


@pytest.mark.parametrize(("text", "error"), [
    ("<|channel|>commentary to=functions.f <|constrain|>json<|message|>{x<|call|>", "not valid JSON"),
    ("<|channel|>commentary to=functions.f json<|message|>[1]<|call|>", "arguments must be a JSON object"),
    ("<|channel|>commentary to=functions. json<|message|>{}<|call|>", "to=functions.NAME"),
])
def test_a_malformed_harmony_call_is_a_span_with_a_reason_and_no_call(text, error):
    harmony = TOOL_PARSERS.get("openai")
    (span,) = harmony.spans(text)
    assert not span.ok and error in (span.error or span.calls[0].error)
    assert harmony.parse(text)[1] == []


def test_a_harmony_call_is_complete_only_at_its_call_marker_and_stays_found():
    harmony = TOOL_PARSERS.get("openai")
    closed = HARMONY_CALL.index("<|call|>") + len("<|call|>")
    for i in range(len(HARMONY_CALL) + 1):
        spans = harmony.spans(HARMONY_CALL[:i] + " tail")
        assert bool(spans) == (i >= closed), HARMONY_CALL[:i]
    assert harmony.spans(HARMONY_CALL.replace("<|call|>", "<|end|>")) == []  # a message, not a call
    assert harmony.spans(HARMONY_CALL.replace("functions.f", "browser.search")) == []  # not a function tool
    assert harmony.parse("plain text, no harmony") == ("plain text, no harmony", [])


@pytest.mark.parametrize(("text", "reasoning", "content"), [
    ("<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>final<|message|>b<|return|>", "a",
     "b<|return|>"),
    ("<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>analysis<|message|>b<|end|>", "a\nb", None),
    ("<|channel|>analysis<|message|>still thinki", "still thinki", None),
    ("<|channel|>final<|message|>no thinking<|return|>", None, "<|channel|>final<|message|>no thinking<|return|>"),
    ("plain", None, "plain"),
])
def test_gpt_oss_reasoning_is_the_opening_analysis_messages(text, reasoning, content):
    parsed = parse_message(text, None, REASONING_PARSERS.get("openai_gptoss"))
    assert (parsed.reasoning, parsed.content) == (reasoning, content)


def test_a_harmony_call_after_the_reasoning_is_read_even_when_the_analysis_was_cut_short():
    parsed = parse_message(HARMONY_CALL, TOOL_PARSERS.get("openai"), REASONING_PARSERS.get("openai_gptoss"))
    assert parsed.reasoning == "Use f." and names_and_arguments(parsed.tool_calls) == [("f", {"x": 1})]
    assert parsed.content is None
    cut = ("<|channel|>analysis<|message|>maybe <|start|>assistant to=functions.g<|channel|>commentary<|message|>"
           "{}<|call|>")  # a new message ends the unclosed analysis
    parsed = parse_message(cut, TOOL_PARSERS.get("openai"), REASONING_PARSERS.get("gpt-oss"))
    assert parsed.reasoning == "maybe" and names_and_arguments(parsed.tool_calls) == [("g", {})]
