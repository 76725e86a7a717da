"""What a tool-call or reasoning parser gives, and the base class every tool parser extends.

A tool parser reads the calls a model wrote in its text. It finds *spans* (:class:`CallSpan`): the
stretches of text, in order, that hold one or more complete calls in its model family's syntax,
each call parsed (:class:`ToolCall`) or, when malformed, carrying the reason. From the spans,
:meth:`ToolParser.parse` derives the agent's view: the text outside the well-formed spans as
content, and the well-formed calls in OpenAI's ``tool_calls`` form. A malformed span stays in the
content; a parser never raises on any text.

A reasoning parser splits the model's reasoning from what follows it
(:meth:`ReasoningParser.split`). Parsing never touches token ids: it reads decoded text, and what is
trained on is the engine's tokens, whatever a parser makes of them.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

#: A tool as OpenAI's API describes it: ``{"type": "function", "function": {"name", "description",
#: "parameters"}}``. Parsers whose syntax carries no types read the parameters' JSON schema.
ToolSpec = dict[str, Any]


@dataclass(frozen=True)
class ToolCall:
    """One call as the model wrote it.

    :ivar name: the called function ('' when none could be read).
    :ivar arguments: its arguments, decoded (empty when malformed).
    :ivar error: why the call is malformed, one line; '' when it is well-formed.
    """

    name: str
    arguments: dict[str, Any]
    error: str = ""

    def openai(self, call_id: str | None = None) -> dict[str, Any]:
        """The call in OpenAI's ``tool_calls`` form, arguments as a JSON string; ``call_id`` or a new
        ``call_<24 hex>`` id."""
        return {"id": call_id or f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                "function": {"name": self.name, "arguments": json.dumps(self.arguments)}}


@dataclass(frozen=True)
class CallSpan:
    """A stretch ``text[start:end]`` that holds complete calls.

    :ivar calls: the calls it holds, in order (a format that lists several calls in one block has
        several; most have one).
    :ivar error: why the whole span is malformed (say, a tagged block that is not JSON), one line;
        then ``calls`` is empty.
    :ivar final: the syntax closes the turn's calls here (a Mistral list, DeepSeek's calls block, a
        harmony ``<|call|>``): no call of the same turn follows it. ``False`` where the syntax lets
        more calls follow (hermes blocks, Llama's ``;``): the turn's calls are complete when it ends.
    """

    start: int
    end: int
    calls: tuple[ToolCall, ...] = ()
    error: str = ""
    final: bool = False

    @property
    def ok(self) -> bool:
        """Whether every call of the span is well-formed (and it has one)."""
        return not self.error and bool(self.calls) and not any(call.error for call in self.calls)


@dataclass(frozen=True)
class ParsedMessage:
    """The agent's view of one model turn.

    :ivar content: the text outside the well-formed calls and the reasoning, stripped; ``None`` when
        that is empty and there are calls or reasoning.
    :ivar tool_calls: the well-formed calls in OpenAI's form, in order.
    :ivar reasoning: the reasoning text, stripped (``None`` without a reasoning parser or reasoning).
    """

    content: str | None
    tool_calls: list[dict[str, Any]]
    reasoning: str | None = None


class ToolParser:
    """Base of the tool parsers: a subclass implements :meth:`spans`; :meth:`parse` is derived.

    A parser is registered under a name (see :mod:`plasmid_serving.parsers.registry`) and built with
    no arguments; it keeps no state between calls.
    """

    #: the name it is registered under (vLLM's ``--tool-call-parser`` name)
    name: ClassVar[str] = ""
    #: whether it reads the reply with the tokenizer's special tokens kept, because its markers are
    #: special tokens in some of its models' tokenizers (every built-in parser but ``pythonic``, as
    #: vLLM's parsers ask for them); a parser without it reads the text a client sees, so no special
    #: token's text can pass for its syntax
    reads_special_tokens: ClassVar[bool] = False

    def spans(self, text: str, tools: list[ToolSpec] | None = None) -> list[CallSpan]:
        """The complete call spans of ``text``, in order, not overlapping.

        Contract: never raises; a first span found in a prefix of a text is found, with the same
        first call, in every longer text that starts with that prefix (a multi-turn loop finds the
        fewest tokens that hold a call by bisection); its ``end`` may grow over a closing marker
        that follows (``deepseek_v3``'s end of the calls block), and it may then become ``final``.
        ``tools`` are the tools offered (may be ``None``); only parsers whose syntax writes every
        value as text read them.
        """
        raise NotImplementedError

    def parse(self, text: str, tools: list[ToolSpec] | None = None) -> tuple[str | None, list[dict[str, Any]]]:
        """``(content, tool_calls)``: the text outside the well-formed spans, stripped (``None`` when
        empty and there are calls), and their calls in OpenAI's form. Without a well-formed span the
        content is ``text`` unchanged (a parser whose format wraps all text in markup, harmony's
        ``openai``, overrides this and gives the text of the messages meant for the user)."""
        kept: list[str] = []
        calls: list[dict[str, Any]] = []
        position = 0
        for span in self.spans(text, tools):
            if not span.ok:
                continue
            kept.append(text[position:span.start])
            position = span.end
            calls.extend(call.openai() for call in span.calls)
        if not calls:
            return text, []
        kept.append(text[position:])
        content = "".join(kept).strip()
        return content or None, calls


class ReasoningParser(Protocol):
    """A reasoning parser, registered under a name (vLLM's and SGLang's ``--reasoning-parser``).
    One may set ``reads_special_tokens = True``, as :class:`ToolParser` documents (harmony's does)."""

    def split(self, text: str) -> tuple[str | None, int]:
        """``(reasoning, content_start)``: the model's reasoning in ``text`` (``None`` when there is
        none) and where the text after it begins (``len(text)`` when all of it is reasoning). Never
        raises."""
        ...


def call_from_json(payload: Any) -> ToolCall:
    """A decoded JSON call ``{"name": NAME, "arguments": {...}}`` as a :class:`ToolCall`.

    ``arguments`` may be a JSON string of an object (OpenAI's form) and may be spelled
    ``parameters`` (Llama 3's); absent, they are ``{}``. Anything else is a call with ``error``.
    """
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str) or not payload["name"]:
        return ToolCall("", {}, error='a tool call is a JSON object {"name": "...", "arguments": {...}}')
    arguments: Any = payload.get("arguments", payload.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            arguments = None
    if not isinstance(arguments, dict):
        return ToolCall(payload["name"], {}, error="the tool call's arguments must be a JSON object")
    return ToolCall(payload["name"], arguments)


def parse_message(text: str, tool_parser: ToolParser | None = None, reasoning_parser: ReasoningParser | None = None,
                  tools: list[ToolSpec] | None = None) -> ParsedMessage:
    """The agent's view of ``text``: reasoning split off first (with ``reasoning_parser``), then the
    calls parsed from the rest (with ``tool_parser``); calls inside the reasoning are not calls.
    Without parsers, the text is the content unchanged."""
    reasoning, rest = None, text
    if reasoning_parser is not None:
        found, start = reasoning_parser.split(text)
        if found is not None:
            reasoning, rest = found.strip(), text[start:]
    if tool_parser is None:
        content: str | None = rest
        calls: list[dict[str, Any]] = []
    else:
        content, calls = tool_parser.parse(rest, tools)
    if reasoning is not None:
        content = (content or "").strip() or None
    return ParsedMessage(content, calls, reasoning)
