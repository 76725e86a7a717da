"""Tool calls in the model's text, as OpenAI's ``tool_calls``.

A call is tagged JSON, ``<tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call>``
(the format of Qwen's and Hermes' chat templates). ``arguments`` may be an object or a JSON string;
``parameters`` is accepted for it too. A tagged block that is not such JSON stays in the text.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """``(content, tool_calls)``: the text outside the well-formed calls (stripped; None when empty
    and there are calls), and one OpenAI tool call per well-formed tagged call, in order."""
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    position = 0
    for match in TOOL_CALL.finditer(text):
        call = _as_call(match.group(1))
        if call is None:
            continue
        kept.append(text[position:match.start()])
        position = match.end()
        calls.append(call)
    if not calls:
        return text, []
    kept.append(text[position:])
    content = "".join(kept).strip()
    return (content or None), calls


def _as_call(body: str) -> dict[str, Any] | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": value["name"], "arguments": json.dumps(arguments)}}
