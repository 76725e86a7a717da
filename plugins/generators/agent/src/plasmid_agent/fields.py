"""The request fields the gateway reads, checked by type as OpenAI's servers check them.

Each check raises :class:`RequestError` (HTTP 400) with a message that names the field and what
it got. Fields the gateway does not know are ignored, as OpenAI's servers ignore them; fields it
knows but cannot honour, and whose meaning would change the answer the client relies on
(``tool_choice: "required"``, ``response_format: json_schema``, a non-empty ``logit_bias``,
``parallel_tool_calls: false``, the legacy ``functions``, ...), are refused with a 400 naming the
field, never ignored (:func:`refuse_unsupported`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

#: At most this many stop strings per request (OpenAI's limit).
MAX_STOPS = 4
#: At most this many choices per request (OpenAI's limit for ``n``).
MAX_CHOICES = 128


class RequestError(Exception):
    """A request the gateway refuses (HTTP 400 unless ``status`` says otherwise), with the reason
    the client is shown; ``headers`` go with the answer."""

    def __init__(self, message: str, status: int = 400, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = dict(headers or {})


@dataclass(frozen=True)
class Sampling:
    """What a request asks of the engine calls it makes: ``n`` completions of at most
    ``max_tokens`` tokens each (``None``: the run's ``--max-new-tokens``), cut at the first of
    ``stops`` (the gateway's job: see :mod:`plasmid_agent.stops`)."""

    max_tokens: int | None = None
    n: int = 1
    stops: tuple[str, ...] = ()


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def integer(body: dict[str, Any], name: str, low: int, high: int | None = None) -> int | None:
    """``body[name]`` when given: an integer from ``low`` (to ``high``); ``None`` when absent or null."""
    value = body.get(name)
    if value is None:
        return None
    if not _is_int(value) or value < low or (high is not None and value > high):
        span = f"from {low} to {high}" if high is not None else f">= {low}"
        raise RequestError(f"'{name}' must be an integer {span}, got {value!r}")
    return int(value)


def number(body: dict[str, Any], name: str, low: float, high: float) -> float | None:
    """``body[name]`` when given: a finite number from ``low`` to ``high``."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low <= value <= high:
        raise RequestError(f"'{name}' must be a number from {low:g} to {high:g}, got {value!r}")
    return float(value)


def boolean(body: dict[str, Any], name: str) -> bool | None:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise RequestError(f"'{name}' must be true or false, got {value!r}")
    return value


def text(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise RequestError(f"'{name}' must be a string, got {type(value).__name__} {str(value)[:60]}")
    return value


def stops(body: dict[str, Any]) -> tuple[str, ...]:
    """``stop``: a string or a list of up to :data:`MAX_STOPS` non-empty strings (null: none)."""
    value = body.get("stop")
    if value is None:
        return ()
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or len(values) > MAX_STOPS or not all(isinstance(v, str) and v for v in values):
        raise RequestError(f"'stop' must be a non-empty string or a list of up to {MAX_STOPS} non-empty strings, "
                           f"got {str(value)[:80]}")
    return tuple(dict.fromkeys(values))


def sampling(body: dict[str, Any], *, max_tokens_names: tuple[str, ...] = ("max_completion_tokens", "max_tokens"),
             stop: bool = True) -> Sampling:
    """The checked sampling fields: ``temperature`` (0-2), ``top_p`` (0-1), ``presence_penalty``
    and ``frequency_penalty`` (-2 to 2) and ``seed`` (an integer) are checked but the run's
    sampling applies (the trainer scores log-probs under it); the ``max_tokens_names`` (the first
    given wins), ``n`` (1 to :data:`MAX_CHOICES`) and ``stop`` are honoured."""
    number(body, "temperature", 0.0, 2.0)
    number(body, "top_p", 0.0, 1.0)
    number(body, "presence_penalty", -2.0, 2.0)
    number(body, "frequency_penalty", -2.0, 2.0)
    if body.get("seed") is not None and not _is_int(body["seed"]):
        raise RequestError(f"'seed' must be an integer, got {body['seed']!r}")
    limits = [integer(body, name, 1) for name in max_tokens_names]
    limit = next((value for value in limits if value is not None), None)
    n = integer(body, "n", 1, MAX_CHOICES) or 1
    return Sampling(max_tokens=limit, n=n, stops=stops(body) if stop else ())


def streaming(body: dict[str, Any]) -> tuple[bool, bool]:
    """``(stream, include_usage)``: ``stream`` a boolean; ``stream_options`` an object (with a
    boolean ``include_usage``) that is only allowed with ``stream: true``, as OpenAI says."""
    stream = bool(boolean(body, "stream"))
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not isinstance(options, dict):
        raise RequestError(f"'stream_options' must be an object, got {str(options)[:60]}")
    if not stream:
        raise RequestError("'stream_options' is only allowed when 'stream' is true")
    include = options.get("include_usage")
    if include is not None and not isinstance(include, bool):
        raise RequestError(f"'stream_options.include_usage' must be true or false, got {include!r}")
    return stream, bool(include)


def function_tool(tool: Any, where: str) -> dict[str, Any]:
    """A Chat Completions tool, ``{"type": "function", "function": {"name", "description"?,
    "parameters"?, "strict"?}}``, checked."""
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise RequestError(f"'{where}' must be {{'type': 'function', 'function': {{'name': ...}}}} (the gateway "
                           f"serves function tools only), got {str(tool)[:80]}")
    function = tool["function"]
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise RequestError(f"'{where}.function.name' must be a non-empty string, got {name!r}")
    if function.get("description") is not None and not isinstance(function["description"], str):
        raise RequestError(f"'{where}.function.description' must be a string")
    if function.get("parameters") is not None and not isinstance(function["parameters"], dict):
        raise RequestError(f"'{where}.function.parameters' must be a JSON schema object")
    return tool


def tools(body: dict[str, Any], name: str = "tools") -> list[dict[str, Any]] | None:
    """``tools``: a list of function tools (:func:`function_tool`); ``None`` when absent or empty."""
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, list):
        raise RequestError(f"'{name}' must be a list of tools, got {type(value).__name__}")
    return [function_tool(tool, f"{name}[{i}]") for i, tool in enumerate(value)] or None


def tool_choice(body: dict[str, Any]) -> str:
    """``tool_choice``: ``"auto"`` (the default) or ``"none"`` (the text is content, no call is
    parsed). ``"required"`` and a named function are refused: the gateway cannot make the model
    call a tool (no constrained decoding), and finding no call after generation is no answer."""
    value = body.get("tool_choice")
    if value is None or value == "auto":
        return "auto"
    if value == "none":
        return "none"
    if value == "required" or isinstance(value, dict):
        raise RequestError(f"'tool_choice' {str(value)[:80]} is not supported by the plasmid gateway: it cannot force "
                           f"the model to call a tool (no constrained decoding); send 'auto' or 'none'")
    raise RequestError(f"'tool_choice' must be 'none', 'auto', 'required' or a named function, got {str(value)[:80]}")


def refuse_unsupported(body: dict[str, Any]) -> None:
    """A 400 naming the first field the gateway knows but cannot honour (see the module docstring)."""
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        kind = fmt.get("type") if isinstance(fmt, dict) else fmt
        raise RequestError(f"'response_format' {str(kind)[:40]!r} is not supported by the plasmid gateway (no "
                           f"constrained decoding); only {{'type': 'text'}}")
    for legacy in ("functions", "function_call"):
        if body.get(legacy) is not None:
            raise RequestError(f"'{legacy}' (OpenAI's deprecated function calling) is not served by the plasmid "
                               f"gateway; send 'tools' and 'tool_choice'")
    if boolean(body, "parallel_tool_calls") is False:
        raise RequestError("'parallel_tool_calls': false is not supported by the plasmid gateway (it cannot keep "
                           "the model to one call); leave it out or send true")
    bias = body.get("logit_bias")
    if bias is not None and (not isinstance(bias, dict) or bias):
        raise RequestError("'logit_bias' is not supported by the plasmid gateway (the trainer scores the run's "
                           "sampling distribution); leave it out")
    modalities = body.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise RequestError(f"'modalities' {str(modalities)[:40]} is not supported: the gateway answers text only")
    for name in ("audio", "prediction", "web_search_options"):
        if body.get(name) is not None:
            raise RequestError(f"'{name}' is not supported by the plasmid gateway")
