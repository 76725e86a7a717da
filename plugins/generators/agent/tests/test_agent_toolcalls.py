"""The gateway's view of a reply (``plasmid_agent.toolcalls``): the run's ``--tool-parser`` and
``--reasoning-parser`` read once from the configuration, hermes when no tool parser is given, and
``(content, tool_calls, reasoning)`` for the response's message."""

from __future__ import annotations

import json

import plasmid_agent.plugin
import pytest
from plasmid_agent.toolcalls import DEFAULT_TOOL_PARSER, parse_reply, parse_tool_calls, parsers_of

from plasmid.errors import UsageError
from plasmid.testing import make_config


def test_without_parser_options_calls_are_read_as_hermes_and_there_is_no_reasoning():
    tool_parser, reasoning_parser = parsers_of(make_config(plasmid_agent.plugin))
    assert tool_parser is DEFAULT_TOOL_PARSER and tool_parser.name == "hermes" and reasoning_parser is None
    content, calls = parse_tool_calls('Sure. <tool_call>{"name": "add", "parameters": {"a": 1}}</tool_call>')
    assert content == "Sure." and [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("add", {"a": 1})]
    assert parse_tool_calls("<tool_call>not json</tool_call>") == ("<tool_call>not json</tool_call>", [])


def test_the_run_s_parsers_give_content_calls_and_reasoning():
    config = make_config(plasmid_agent.plugin, tool_parser="mistral", reasoning_parser="qwen3")
    tool_parser, reasoning_parser = parsers_of(config)
    content, calls, reasoning = parse_reply('<think>add them</think>[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}',
                                            tool_parser, reasoning_parser)
    assert (content, reasoning) == (None, "add them")
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("add", {"a": 1, "b": 2})]
    assert parse_reply("<think>hmm</think>  just text ", tool_parser, reasoning_parser) == ("just text", [], "hmm")


def test_an_unknown_parser_stops_the_run_with_the_flag_named():
    with pytest.raises(UsageError, match="^--reasoning-parser 'o1'"):
        parsers_of(make_config(plasmid_agent.plugin, reasoning_parser="o1"))
