"""OpenAI's harmony format (gpt-oss): the ``openai`` tool parser and the ``openai_gptoss`` reasoning
parser, named as vLLM's ``--tool-call-parser openai`` and ``--reasoning-parser openai_gptoss``.

A gpt-oss turn is a run of messages. The prompt ends with ``<|start|>assistant``, so the first
message's header follows at once; each later one begins ``<|start|>assistant``. A header names the
channel and may name a recipient and a content type, then ``<|message|>`` opens the body, which ends
at ``<|end|>``, ``<|call|>`` (a tool call: the model's turn ends there) or ``<|return|>`` (the end of
the final answer)::

    <|channel|>analysis<|message|>The user wants the weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo"}
    <|call|>

(one line; broken here to fit).

The recipient may also stand after the role, as gpt-oss's chat template renders past calls
(``<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>...``). Channels:
``analysis`` is the model's reasoning, ``commentary`` holds tool calls (and short preambles meant
for the user), ``final`` the answer. These markers are special tokens of gpt-oss's tokenizer: parse
a decode that keeps them (``skip_special_tokens=False``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from plasmid_serving.parsers.base import CallSpan, ToolCall, ToolParser, ToolSpec, call_from_json

START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
END, CALL, RETURN = "<|end|>", "<|call|>", "<|return|>"
#: Where a body ends: the markers that close a message, and ``<|start|>`` (a message cut short).
_BODY_END = re.compile("|".join(re.escape(marker) for marker in (END, CALL, RETURN, START)))
_CHANNEL = re.compile(re.escape(CHANNEL) + r"([^\s<]+)")
_RECIPIENT = re.compile(r"(?:^|\s)to=([^\s<]+)")
#: The recipient prefix of a function tool (gpt-oss's built-in ``browser.*`` and ``python`` are not ours).
FUNCTIONS = "functions."


@dataclass(frozen=True)
class Message:
    """One harmony message in a text: ``text[start:end]`` whole, ``text[body:body_end]`` its body.

    :ivar channel: its channel ('' when the header names none).
    :ivar recipient: whom it is addressed to ('' when no one: a message to the user).
    :ivar closer: the marker that ended it (``<|end|>``, ``<|call|>``, ``<|return|>``), '' when the
        text ends inside its body or a ``<|start|>`` cuts it short.
    """

    start: int
    body: int
    body_end: int
    end: int
    channel: str
    recipient: str
    closer: str


def messages(text: str) -> list[Message]:
    """The messages of ``text`` in order, from its start on: each up to its ``<|message|>`` is a
    header (an opening ``<|start|>`` and the role included), and its body runs to the marker that
    closes it. A header that is not finished (no ``<|message|>`` yet) ends the list. Never raises."""
    found: list[Message] = []
    position = 0
    while position < len(text):
        opened = text.find(MESSAGE, position)
        if opened < 0:
            break
        header = text[position:opened]
        restart = header.find(START, 1)
        if restart >= 0:  # a header abandoned for a new message: read on from there
            position += restart
            continue
        channel = _CHANNEL.search(header)
        recipient = _RECIPIENT.search(header.replace(CHANNEL, " "))
        body = opened + len(MESSAGE)
        close = _BODY_END.search(text, body)
        if close is None:
            body_end = end = len(text)
            closer = ""
        elif close.group() == START:
            body_end = end = close.start()
            closer = ""
        else:
            body_end, end, closer = close.start(), close.end(), close.group()
        found.append(Message(position, body, body_end, end, channel.group(1) if channel else "",
                             recipient.group(1) if recipient else "", closer))
        position = end
    return found


class Harmony(ToolParser):
    """``openai``: each message addressed ``to=functions.NAME`` and closed by ``<|call|>`` is a span
    (from its ``<|start|>``, or its header when it opens the text, to the ``<|call|>``) holding one
    call, its body the arguments as a JSON object (a body that is not is a malformed call). gpt-oss
    ends its turn at ``<|call|>``, so the span is ``final``.

    The content (:meth:`parse`) of a text with harmony messages is the bodies of those addressed to
    no one on a channel other than ``analysis`` (the ``final`` answer, ``commentary`` preambles),
    joined; the reasoning (``analysis``) and the markers are not content. A text without any
    message is content as it is.
    """

    name = "openai"
    reads_special_tokens = True

    def spans(self, text: str, tools: list[ToolSpec] | None = None) -> list[CallSpan]:
        spans = []
        for message in messages(text):
            if message.closer != CALL or not message.recipient.startswith(FUNCTIONS):
                continue
            name = message.recipient[len(FUNCTIONS):]
            try:
                arguments = json.loads(text[message.body:message.body_end] or "{}")
            except json.JSONDecodeError as exc:
                spans.append(CallSpan(message.start, message.end, final=True,
                                      error=f"the tool call's arguments are not valid JSON ({exc.msg} at "
                                            f"character {exc.pos})"))
                continue
            call = call_from_json({"name": name, "arguments": arguments}) if name else ToolCall(
                "", {}, error="a harmony tool call is addressed to=functions.NAME")
            spans.append(CallSpan(message.start, message.end, (call,), final=True))
        return spans

    def parse(self, text: str, tools: list[ToolSpec] | None = None) -> tuple[str | None, list[dict[str, object]]]:
        found = messages(text)
        if not found:
            return text, []
        calls = [call.openai() for span in self.spans(text, tools) if span.ok for call in span.calls]
        shown = [text[m.body:m.body_end] for m in found if not m.recipient and m.channel != "analysis"]
        content = "".join(shown).strip()
        return content or None, calls


class GptOss:
    """``openai_gptoss``: the ``analysis`` messages that open the text are the reasoning (their
    bodies joined by a newline); the content starts at the body of a ``final`` message that comes
    next (so a reply without tool calls reads as its answer), else at the next message's start.
    A text that does not open with an ``analysis`` message has no reasoning; one that holds
    nothing else is all reasoning."""

    #: harmony's markers are special tokens (see :attr:`ToolParser.reads_special_tokens`)
    reads_special_tokens = True

    def split(self, text: str) -> tuple[str | None, int]:
        """``(reasoning, content_start)``; see :meth:`plasmid_serving.parsers.base.ReasoningParser.split`."""
        found = messages(text)
        thoughts: list[str] = []
        for message in found:
            if message.channel != "analysis" or message.recipient:
                if not thoughts:
                    return None, 0
                plain = message.channel == "final" and not message.recipient
                return "\n".join(thoughts), message.body if plain else message.start
            thoughts.append(text[message.body:message.body_end])
        return ("\n".join(thoughts), len(text)) if thoughts else (None, 0)
