"""The built-in tool parsers, one per model family's call syntax, named as vLLM's ``--tool-call-parser``.

- ``hermes``: ``<tool_call>{"name": NAME, "arguments": {...}}</tool_call>`` (Hermes, Qwen2.5, Qwen3).
- ``llama3_json``: Llama 3.x, ``{"name": NAME, "parameters": {...}}`` at the start of the turn,
  optionally after ``<|python_tag|>``; several separated by ``;``.
- ``mistral``: ``[TOOL_CALLS][{"name": NAME, "arguments": {...}}, ...]`` (v3 tokenizers) and
  ``[TOOL_CALLS]NAME[ARGS]{...}`` (v11 and later, optionally ``[CALL_ID]ID`` before ``[ARGS]``).
- ``deepseek_v3``: ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME`` then
  a fenced JSON block and ``<｜tool▁call▁end｜>``, several before ``<｜tool▁calls▁end｜>``.
- ``qwen3_coder``: ``<tool_call><function=NAME><parameter=KEY>VALUE</parameter>...</function></tool_call>``;
  values are text, typed by the tool's JSON schema (an ``integer`` parameter's ``"3"`` is ``3``).
- ``pythonic``: ``[name(key=value, ...), ...]`` with Python literals (Llama 3.2 and 4 style).

A call is only complete where its syntax closes: an unterminated call is no call (a multi-turn loop
waits for more text; the agent gateway returns it as content). A Mistral list, DeepSeek's calls
block (with its closing marker) and a pythonic list close the turn's calls: their spans are
``final``.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from plasmid_serving.parsers.base import CallSpan, ToolCall, ToolParser, ToolSpec, call_from_json

_DECODER = json.JSONDecoder()
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
_TAGGED = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position].isspace():
        position += 1
    return position


class Hermes(ToolParser):
    """``hermes`` (SGLang: ``qwen25``): tagged JSON calls, anywhere in the text, each its own span."""

    name = "hermes"
    reads_special_tokens = True

    def spans(self, text: str, tools: list[ToolSpec] | None = None) -> list[CallSpan]:
        spans = []
        for match in _TAGGED.finditer(text):
            body = match.group(1).strip()
            try:
                payload = json.loads(body)
            except json.JSONDecodeError as exc:
                spans.append(CallSpan(match.start(), match.end(),
                                      error=f"the tool call is not valid JSON ({exc.msg} at character {exc.pos})"))
                continue
            spans.append(CallSpan(match.start(), match.end(), (call_from_json(payload),)))
        return spans


PYTHON_TAG = "<|python_tag|>"


class Llama3Json(ToolParser):
    """``llama3_json`` (SGLang: ``llama3``): JSON objects that open the turn.

    The turn (after blanks) may begin with ``<|python_tag|>``; then each JSON object, separated from
    the next by blanks or ``;``, is a span (the first with the tag, the others with the separator
    before them). Without the tag, an object that has no string ``name``
    is the model's answer, not a call (no span); after the tag, it is a malformed call.
    """

    name = "llama3_json"
    reads_special_tokens = True

    def spans(self, text: str, tools: list[ToolSpec] | None = None) -> list[CallSpan]:
        position = span_start = _skip_space(text, 0)
        tagged = text.startswith(PYTHON_TAG, position)
        if tagged:
            position = _skip_space(text, position + len(PYTHON_TAG))
        spans: list[CallSpan] = []
        while position < len(text) and text[position] == "{":
            try:
                payload, end = _DECODER.raw_decode(text, position)
            except json.JSONDecodeError:
                break  # not complete (yet), or not JSON: what follows is content
            if not tagged and not (isinstance(payload, dict) and isinstance(payload.get("name"), str)):
                break
            spans.append(CallSpan(span_start, end, (call_from_json(payload),)))  # the tag or separator with it
            span_start = end
            position = _skip_space(text, end)
            if text.startswith(";", position):
                position = _skip_space(text, position + 1)
        return spans


MISTRAL_CALLS, MISTRAL_ARGS, MISTRAL_CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
_NAME = re.compile(r"[A-Za-z0-9_.\-]*")


class Mistral(ToolParser):
    """``mistral``: ``[TOOL_CALLS]`` then a JSON list of calls (one span holding them all; one object
    alone is one call), or then ``NAME[ARGS]{...}`` directly (one span per ``[TOOL_CALLS]``).

    After ``[TOOL_CALLS]`` and blanks, something that is neither JSON nor a name is a malformed span
    ending there; so is an empty list, and a name followed by anything but ``[ARGS]``.
    """

    name = "mistral"
    reads_special_tokens = True

    def spans(self, text: str, tools: list[ToolSpec] | None = None) -> list[CallSpan]:
        spans: list[CallSpan] = []
        position = 0
        while (start := text.find(MISTRAL_CALLS, position)) >= 0:
            span = self._span(text, start)
            if span is None:
                break  # not complete (yet)
            spans.append(span)
            position = max(span.end, start + len(MISTRAL_CALLS))
        return spans

    def _span(self, text: str, start: int) -> CallSpan | None:
        body = start + len(MISTRAL_CALLS)
        position = _skip_space(text, body)
        if position == len(text):
            return None
        if text[position] in "[{":
            try:
                payload, end = _DECODER.raw_decode(text, position)
            except json.JSONDecodeError:
                return None
            entries = payload if isinstance(payload, list) else [payload]
            if not entries:
                return CallSpan(start, end, error="[TOOL_CALLS] holds an empty list; give at least one call",
                                final=True)
            return CallSpan(start, end, tuple(call_from_json(entry) for entry in entries), final=True)
        name_end = _NAME.match(text, body).end()  # type: ignore[union-attr]  # matches the empty string
        if position > body or name_end == body:
            return CallSpan(start, position, error='[TOOL_CALLS] is followed by a JSON list of calls, [{"name": '
                                                   '"...", "arguments": {...}}, ...], or by NAME[ARGS]{...}')
        after = name_end
        if text.startswith(MISTRAL_CALL_ID, after):
            after = _NAME.match(text, after + len(MISTRAL_CALL_ID)).end()  # type: ignore[union-attr]
        elif MISTRAL_CALL_ID.startswith(text[after:]):
            return None
        if MISTRAL_ARGS.startswith(text[after:]):
            return None
        if not text.startswith(MISTRAL_ARGS, after):
            return CallSpan(start, after, error=f"[TOOL_CALLS]{text[body:name_end]} is followed by [ARGS] and its "
                                                "arguments as a JSON object")
        position = _skip_space(text, after + len(MISTRAL_ARGS))
        try:
            arguments, end = _DECODER.raw_decode(text, position)
        except json.JSONDecodeError:
            return None
        return CallSpan(start, end, (call_from_json({"name": text[body:name_end], "arguments": arguments}),))


DS_CALLS_BEGIN, DS_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL_BEGIN, DS_CALL_END, DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_DS_BLOCK = re.compile(re.escape(DS_CALL_BEGIN) + r"(.*?)" + re.escape(DS_CALL_END), re.DOTALL)
_DS_INSIDE = re.compile(r"(?P<kind>[^\n]*?)" + re.escape(DS_SEP) + r"(?P<name>[^\n]*)\n```(?:json)?\n"
                        r"(?P<arguments>.*)\n```\s*", re.DOTALL)


class DeepSeekV3(ToolParser):
    """``deepseek_v3`` (SGLang: ``deepseekv3``): each ``<｜tool▁call▁begin｜>...<｜tool▁call▁end｜>``
    block is a span (``TYPE<｜tool▁sep｜>NAME``, a newline, the arguments as a fenced JSON block);
    the first span reaches back over a ``<｜tool▁calls▁begin｜>`` just before it, and a span reaches
    on over a ``<｜tool▁calls▁end｜>`` just after it, so the agent's content holds neither."""

    name = "deepseek_v3"
    reads_special_tokens = True

    def spans(self, text: str, tools: list[ToolSpec] | None = None) -> list[CallSpan]:
        spans: list[CallSpan] = []
        for match in _DS_BLOCK.finditer(text):
            start, end = match.start(), match.end()
            before = text[:start].rstrip()
            if not spans and before.endswith(DS_CALLS_BEGIN):
                start = len(before) - len(DS_CALLS_BEGIN)
            after = _skip_space(text, end)
            final = text.startswith(DS_CALLS_END, after)
            if final:
                end = after + len(DS_CALLS_END)
            inside = _DS_INSIDE.fullmatch(match.group(1))
            if inside is None:
                spans.append(CallSpan(start, end, error="a deepseek_v3 tool call is TYPE<｜tool▁sep｜>NAME, a "
                                                        "newline, and its arguments in a ```json block", final=final))
                continue
            try:
                arguments = json.loads(inside["arguments"])
            except json.JSONDecodeError as exc:
                spans.append(CallSpan(start, end, error=f"the tool call's arguments are not valid JSON ({exc.msg} "
                                                        f"at character {exc.pos})", final=final))
                continue
            spans.append(CallSpan(start, end, (call_from_json({"name": inside["name"].strip(),
                                                               "arguments": arguments}),), final=final))
        return spans


_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*?)</function>\s*", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


class Qwen3Coder(ToolParser):
    """``qwen3_coder``: tagged XML calls, each ``<tool_call>`` block a span. A value is the text
    between its tags less one newline at each end, converted by the parameter's schema type in
    ``tools`` (``string`` stays text; ``integer``, ``number``, ``boolean`` are read as such, else the
    text stays); a parameter with another or no schema is read as JSON when it is JSON, else text."""

    name = "qwen3_coder"
    reads_special_tokens = True

    def spans(self, text: str, tools: list[ToolSpec] | None = None) -> list[CallSpan]:
        spans = []
        for match in _TAGGED.finditer(text):
            function = _FUNCTION.fullmatch(match.group(1))
            if function is None:
                spans.append(CallSpan(match.start(), match.end(),
                                      error="a qwen3_coder tool call is <function=NAME> with <parameter=KEY>VALUE"
                                            "</parameter> inside, closed by </function>"))
                continue
            name = function.group(1).strip()
            schema = _parameters(tools, name)
            arguments = {}
            for parameter in _PARAMETER.finditer(function.group(2)):
                key, value = parameter.group(1).strip(), parameter.group(2)
                value = value[1:] if value.startswith("\n") else value
                value = value[:-1] if value.endswith("\n") else value
                arguments[key] = _typed(value, schema.get(key))
            spans.append(CallSpan(match.start(), match.end(), (ToolCall(name, arguments),)))
        return spans


def _parameters(tools: list[ToolSpec] | None, name: str) -> dict[str, Any]:
    """The JSON schemas of the parameters of tool ``name`` in ``tools`` (``{}`` when unknown)."""
    for tool in tools or ():
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and function.get("name") == name:
            properties = (function.get("parameters") or {}).get("properties")
            return properties if isinstance(properties, dict) else {}
    return {}


def _typed(value: str, schema: Any) -> Any:
    kind = schema.get("type") if isinstance(schema, dict) else None
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    if kind == "string":
        return value
    if kind == "boolean":
        lowered = value.strip().lower()
        return lowered == "true" if lowered in ("true", "false") else value
    try:
        decoded = json.loads(value)
    except ValueError:
        return value
    if kind == "integer" and not (isinstance(decoded, int) and not isinstance(decoded, bool)):
        return value
    if kind == "number" and not (isinstance(decoded, int | float) and not isinstance(decoded, bool)):
        return value
    return decoded


class Pythonic(ToolParser):
    """``pythonic``: a Python list of calls opening the turn, ``[name(key=value, ...), ...]``, values
    Python literals; the span ends at the first ``]`` that closes such a list. A list whose items are
    not all calls is the model's answer (no span); a call with positional or non-literal arguments
    is malformed."""

    name = "pythonic"

    def spans(self, text: str, tools: list[ToolSpec] | None = None) -> list[CallSpan]:
        start = _skip_space(text, 0)
        if not text.startswith("[", start):
            return []
        close = start
        while (close := text.find("]", close + 1)) >= 0:
            try:
                tree = ast.parse(text[start:close + 1], mode="eval")
            except (SyntaxError, ValueError):
                continue
            items = tree.body.elts if isinstance(tree.body, ast.List) else []
            if not items or not all(isinstance(item, ast.Call) and isinstance(item.func, ast.Name) for item in items):
                return []
            return [CallSpan(start, close + 1, tuple(_python_call(item) for item in items),  # type: ignore[arg-type]
                             final=True)]
        return []


def _python_call(node: ast.Call) -> ToolCall:
    name = node.func.id  # type: ignore[attr-defined]  # checked by the caller
    if node.args or any(keyword.arg is None for keyword in node.keywords):
        return ToolCall(name, {}, error="a pythonic tool call takes keyword arguments only, name(key=value, ...)")
    try:
        return ToolCall(name, {keyword.arg: ast.literal_eval(keyword.value) for keyword in node.keywords
                               if keyword.arg is not None})
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return ToolCall(name, {}, error="a pythonic tool call's values are Python literals (strings, numbers, "
                                        "lists, dicts, True, False, None)")
