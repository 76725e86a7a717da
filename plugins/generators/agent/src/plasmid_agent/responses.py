"""OpenAI's Responses API (``POST /v1/responses``), as much as the OpenAI Agents SDK's default
model class (``OpenAIResponsesModel``) uses, mapped onto the gateway's chat endpoint.

The request: ``input`` a string (one user message) or a list of items: messages (``role``
``system``, ``developer`` (rendered as ``system``), ``user`` or ``assistant``; ``content`` a string
or ``input_text``/``output_text`` parts, and in user messages ``input_image`` parts whose
``image_url`` is a data URL, for a vision-language policy), ``function_call`` items (``call_id``,
``name``, ``arguments``), which join the assistant message before them as its ``tool_calls``, and
``function_call_output`` items (``call_id``, ``output``: a string or parts, ``input_image`` ones
too) as ``tool`` messages; ``reasoning`` items are dropped. Images are read as the chat endpoint
reads ``image_url`` parts (:meth:`plasmid_agent.gateway.Gateway.images_of`), errors naming the
``input`` field. ``instructions`` is a system message first. ``tools`` are function tools
(``{"type": "function", "name", "description", "parameters"}``), given to the chat template as
Chat Completions tools. ``tool_choice`` and ``text.format`` (``{"type": "text"}`` only) as for chat
(:mod:`plasmid_agent.fields`); ``max_output_tokens`` honoured up to ``--max-new-tokens``;
``temperature``/``top_p`` checked, the run's apply. The gateway stores no response, so
``previous_response_id``, ``conversation``, stored ``prompt`` and ``background`` are refused (400).

The answer: a ``response`` object whose ``output`` is a ``reasoning`` item (with a reasoning
parser, when the reply reasons), a ``message`` item (one ``output_text``
part) when the model wrote text and one ``function_call`` item per parsed tool call, with
``usage`` in tokens; ``status`` ``completed``, or ``incomplete`` (``max_output_tokens``) when the
engine stopped on the length. Streamed (``stream: true``) as the events the SDK reads:
``response.created``, ``response.in_progress``, ``response.output_item.added``,
``response.content_part.added``, ``response.output_text.delta``/``.done``,
``response.content_part.done``, ``response.function_call_arguments.delta``/``.done``,
``response.output_item.done`` and ``response.completed`` (or ``response.incomplete``), each
with its ``sequence_number``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from plasmid_agent import fields
from plasmid_agent.fields import RequestError

#: Message roles the Responses API takes, and the chat role each renders as.
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


@dataclass(frozen=True)
class ResponsesRequest:
    """A checked ``/v1/responses`` request as the chat endpoint's parts.

    :ivar messages: chat messages (as :func:`plasmid_agent.gateway.normalize_message` makes them).
    :ivar tools: Chat Completions function tools, or None.
    :ivar image_fields: the request field of each image part of ``messages``, in order
        (``input[2].content[0]``), for errors.
    """

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    tool_choice: str
    max_output_tokens: int | None
    stream: bool
    image_fields: tuple[str, ...] = ()


def parse_request(body: dict[str, Any]) -> ResponsesRequest:
    """The request ``body`` checked and mapped (see the module docstring); a bad or unsupported
    field is a :class:`RequestError` naming it."""
    for name in ("previous_response_id", "conversation", "prompt"):
        if body.get(name) is not None:
            raise RequestError(f"'{name}' is not supported by the plasmid gateway: it stores no responses or "
                               f"prompts; send the whole conversation as 'input'")
    if fields.boolean(body, "background"):
        raise RequestError("'background' is not supported by the plasmid gateway")
    if fields.boolean(body, "parallel_tool_calls") is False:
        raise RequestError("'parallel_tool_calls': false is not supported by the plasmid gateway (it cannot keep "
                           "the model to one call); leave it out or send true")
    text_options = body.get("text")
    if text_options is not None:
        if not isinstance(text_options, dict):
            raise RequestError(f"'text' must be an object, got {str(text_options)[:60]}")
        fmt = text_options.get("format")
        if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
            kind = fmt.get("type") if isinstance(fmt, dict) else fmt
            raise RequestError(f"'text.format' {str(kind)[:40]!r} is not supported by the plasmid gateway (no "
                               f"constrained decoding); only {{'type': 'text'}}")
    fields.number(body, "temperature", 0.0, 2.0)
    fields.number(body, "top_p", 0.0, 1.0)
    stream = bool(fields.boolean(body, "stream"))
    limit = fields.integer(body, "max_output_tokens", 1)
    instructions = fields.text(body, "instructions")
    image_fields: list[str] = []
    messages = ([{"role": "system", "content": instructions}] if instructions else []) + input_messages(
        body, image_fields)
    return ResponsesRequest(messages=messages, tools=function_tools(body), tool_choice=fields.tool_choice(body),
                            max_output_tokens=limit, stream=stream, image_fields=tuple(image_fields))


def _content(content: Any, where: str, image_fields: list[str] | None = None) -> str | list[dict[str, Any]]:
    """``content`` (a string or parts; ``where`` its field) as a chat message's content: text, or with
    ``input_image`` parts (only where ``image_fields`` is given, which collects their fields) a list of
    ``text`` and ``image_url`` parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestError(f"'{where}' must be a string or a list of text parts, got {type(content).__name__}")
    parts: list[dict[str, Any]] = []
    for number, part in enumerate(content):
        if image_fields is not None and isinstance(part, dict) and part.get("type") == "input_image":
            if not isinstance(part.get("image_url"), str):
                raise RequestError(f"'{where}[{number}].image_url' must be a data URL string (the gateway "
                                   f"stores no files, so file_id is not read), got {str(part)[:80]}")
            image_fields.append(f"{where}[{number}]")
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
            continue
        if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text") \
                or not isinstance(part.get("text"), str):
            kinds = "an input_text, output_text or input_image part" if image_fields is not None \
                else "an input_text or output_text part with a string 'text'"
            raise RequestError(f"'{where}[{number}]' must be {kinds}, got {str(part)[:80]}")
        parts.append({"type": "text", "text": part["text"]})
    if any(part["type"] == "image_url" for part in parts):
        return parts
    return "".join(part["text"] for part in parts)


def input_messages(body: dict[str, Any], image_fields: list[str] | None = None) -> list[dict[str, Any]]:
    """``input`` as chat messages (see the module docstring); the field of each image part found is
    appended to ``image_fields`` (without it, an image part is refused)."""
    items = body.get("input")
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise RequestError("'input' must be a string or a non-empty list of items")
    messages: list[dict[str, Any]] = []
    for number, item in enumerate(items):
        where = f"input[{number}]"
        if not isinstance(item, dict):
            raise RequestError(f"'{where}' must be an object, got {str(item)[:80]}")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ROLES:
                raise RequestError(f"'{where}.role' must be one of {', '.join(ROLES)}, got {role!r}")
            messages.append({"role": ROLES[role], "content": _content(
                item.get("content"), f"{where}.content", image_fields if role == "user" else None)})
        elif kind == "function_call":
            for name in ("call_id", "name", "arguments"):
                if not isinstance(item.get(name), str):
                    raise RequestError(f"'{where}.{name}' must be a string, got {item.get(name)!r}")
            try:
                arguments = json.loads(item["arguments"])
            except ValueError:
                arguments = item["arguments"]
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": arguments}}
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": ""}
                messages.append(last)
            last.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(item.get("call_id"), str):
                raise RequestError(f"'{where}.call_id' must be a string, got {item.get('call_id')!r}")
            messages.append({"role": "tool", "tool_call_id": item["call_id"],
                             "content": _content(output, f"{where}.output", image_fields)})
        elif kind == "reasoning":
            continue
        else:
            raise RequestError(f"'{where}.type' {kind!r} is not supported by the plasmid gateway (it takes message, "
                               f"function_call, function_call_output and reasoning items)")
    if not messages:
        raise RequestError("'input' holds no message")
    return messages


def function_tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The Responses function tools as Chat Completions tools; other tool types are refused."""
    value = body.get("tools")
    if value is None:
        return None
    if not isinstance(value, list):
        raise RequestError(f"'tools' must be a list of tools, got {type(value).__name__}")
    tools = []
    for number, tool in enumerate(value):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else tool
            raise RequestError(f"'tools[{number}]' of type {str(kind)[:40]!r} is not supported by the plasmid "
                               f"gateway (function tools only)")
        function = {key: tool[key] for key in ("name", "description", "parameters", "strict") if key in tool}
        tools.append(fields.function_tool({"type": "function", "function": function}, f"tools[{number}]"))
    return tools or None


def response_object(body: dict[str, Any], request: ResponsesRequest, model: str, content: str | None,
                    tool_calls: list[dict[str, Any]], choice: Any, prompt_tokens: int,
                    reasoning: str | None = None) -> dict[str, Any]:
    """The finished ``response`` object of one completion (``choice``: a
    :class:`plasmid_agent.gateway.Choice`), its text ``content``, parsed ``tool_calls`` and
    ``reasoning`` (a ``reasoning`` item first, its text one ``reasoning_text`` part)."""
    output: list[dict[str, Any]] = []
    if reasoning is not None:
        output.append({"type": "reasoning", "id": f"rs_{uuid.uuid4().hex}", "summary": [], "status": "completed",
                       "content": [{"type": "reasoning_text", "text": reasoning}]})
    if content:
        output.append({"type": "message", "id": f"msg_{uuid.uuid4().hex}", "role": "assistant",
                       "status": "completed", "content": [{"type": "output_text", "text": content,
                                                           "annotations": [], "logprobs": []}]})
    for call in tool_calls:
        output.append({"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": call["id"],
                       "name": call["function"]["name"], "arguments": call["function"]["arguments"],
                       "status": "completed"})
    completion = len(choice.call.completion_ids)
    incomplete = choice.finish == "length" and not tool_calls
    return {
        "id": f"resp_{uuid.uuid4().hex}", "object": "response", "created_at": int(time.time()),
        "model": body.get("model") or model, "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None, "error": None,
        "instructions": body.get("instructions"), "output": output,
        "tools": body.get("tools") or [], "tool_choice": body.get("tool_choice") or "auto",
        "parallel_tool_calls": True, "max_output_tokens": request.max_output_tokens,
        "temperature": body.get("temperature"), "top_p": body.get("top_p"), "previous_response_id": None,
        "text": {"format": {"type": "text"}}, "truncation": "disabled", "metadata": body.get("metadata") or {},
        "usage": {"input_tokens": prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": prompt_tokens + completion},
    }


async def stream_events(response: dict[str, Any], pieces: list[str]) -> AsyncIterator[str]:
    """The server-sent events of ``response`` (finished), its message text sent as ``pieces``
    (they join to the text), as the module docstring lists them."""
    number = 0

    def event(kind: str, **payload: Any) -> str:
        nonlocal number
        number += 1
        return json.dumps({"type": kind, "sequence_number": number - 1, **payload})

    start = {**response, "status": "in_progress", "output": [], "incomplete_details": None, "usage": None}
    yield event("response.created", response=start)
    yield event("response.in_progress", response=start)
    for index, item in enumerate(response["output"]):
        if item["type"] == "message":
            part = item["content"][0]
            yield event("response.output_item.added", output_index=index,
                        item={**item, "status": "in_progress", "content": []})
            yield event("response.content_part.added", item_id=item["id"], output_index=index, content_index=0,
                        part={**part, "text": ""})
            for piece in pieces:
                if piece:
                    yield event("response.output_text.delta", item_id=item["id"], output_index=index,
                                content_index=0, delta=piece, logprobs=[])
            yield event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0,
                        text=part["text"], logprobs=[])
            yield event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                        part=part)
        elif item["type"] == "reasoning":
            yield event("response.output_item.added", output_index=index, item=item)
        else:
            yield event("response.output_item.added", output_index=index,
                        item={**item, "status": "in_progress", "arguments": ""})
            yield event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                        delta=item["arguments"])
            yield event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                        name=item["name"], arguments=item["arguments"])
        yield event("response.output_item.done", output_index=index, item=item)
    done = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
    yield event(done, response=response)
