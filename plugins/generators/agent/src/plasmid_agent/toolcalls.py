"""Tool calls and reasoning in the model's text, as OpenAI's ``tool_calls`` and ``reasoning_content``.

A thin call into the shared parser family (:mod:`plasmid_serving.parsers`): ``--tool-parser NAME``
(vLLM's names: hermes, llama3_json, mistral, deepseek_v3, qwen3_coder, pythonic, or one a package
registers) and ``--reasoning-parser NAME`` (deepseek_r1, qwen3, ...), read once per gateway with
:func:`parsers_of`. Without ``--tool-parser`` the syntax is ``hermes``, the tagged JSON of Qwen's and
Hermes' chat templates: ``<tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call>``
(``arguments`` may be an object or a JSON string; ``parameters`` is accepted for it too). A call
that is not well-formed stays in the text. Parsing gives the agent's view only: the sample keeps the
engine's token ids.

The gateway parses the reply decoded with its special tokens kept (a tokenizer may make a format's
markers special tokens: Mistral's ``[TOOL_CALLS]``, DeepSeek's, harmony's ``<|channel|>``, which
``skip_special_tokens=True`` would drop), then removes the special tokens the parsers left in the
content and reasoning (:func:`without_special`), as the client would see them otherwise.
"""

from __future__ import annotations

import re
from typing import Any

from plasmid.options import HoldsOptions
from plasmid_serving.parsers import ReasoningParser, ToolParser, parse_message
from plasmid_serving.parsers.options import ParserOptions
from plasmid_serving.parsers.tools import Hermes

#: The tool parser when ``--tool-parser`` is not given (parsers keep no state: one serves all).
DEFAULT_TOOL_PARSER = Hermes()


def parsers_of(config: HoldsOptions) -> tuple[ToolParser, ReasoningParser | None]:
    """The run's tool parser (``--tool-parser``, else :data:`DEFAULT_TOOL_PARSER`, ``hermes``) and reasoning
    parser (``--reasoning-parser``, else ``None``)."""
    options = ParserOptions.of(config)
    return options.tool() or DEFAULT_TOOL_PARSER, options.reasoning()


def parse_reply(text: str, tool_parser: ToolParser | None = None, reasoning_parser: ReasoningParser | None = None,
                tools: list[dict[str, Any]] | None = None) -> tuple[str | None, list[dict[str, Any]], str | None]:
    """``(content, tool_calls, reasoning)`` of a reply's text: the reasoning split off with
    ``reasoning_parser`` (``None`` without one or without reasoning), then the well-formed calls of
    the rest with ``tool_parser`` (``hermes`` when ``None``) in OpenAI's form, and the remaining
    text, stripped, as content (``None`` when empty and there are calls or reasoning; the text
    unchanged when there are neither). ``tools`` are the request's tools (their schemas type the
    values of parsers such as ``qwen3_coder``)."""
    parsed = parse_message(text, tool_parser or DEFAULT_TOOL_PARSER, reasoning_parser, tools)
    return parsed.content, parsed.tool_calls, parsed.reasoning


def parse_tool_calls(text: str, tool_parser: ToolParser | None = None) -> tuple[str | None, list[dict[str, Any]]]:
    """``(content, tool_calls)`` of :func:`parse_reply` without a reasoning parser."""
    content, calls, _ = parse_reply(text, tool_parser)
    return content, calls


def special_tokens(tokenizer: Any) -> tuple[str, ...]:
    """The text of every special token of ``tokenizer`` (a Hugging Face tokenizer's
    ``all_special_tokens`` and its added tokens marked special), longest first; ``()`` for a
    tokenizer that names none."""
    found = set(getattr(tokenizer, "all_special_tokens", None) or ())
    for token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(token, "special", False):
            found.add(str(token.content))
    return tuple(sorted((t for t in found if t), key=lambda t: (-len(t), t)))


def without_special(text: str | None, specials: tuple[str, ...]) -> str | None:
    """``text`` without any of ``specials`` (what ``skip_special_tokens=True`` would have left of
    it), stripped; ``None`` when that is empty or ``text`` is ``None``."""
    if text is None:
        return None
    if specials:
        text = re.sub("|".join(re.escape(token) for token in specials), "", text)
    return text.strip() or None
