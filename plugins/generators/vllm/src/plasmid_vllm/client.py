"""HTTP calls to a vLLM server: asynchronous (the engine) and blocking (start-up, the health monitor).

Both answer ``(status, body text)`` and raise :class:`ServerUnreachable` when no answer came
(refused, reset, timed out): the caller decides whether to wait for a restart and retry.
:func:`expect_ok` turns a control call's answer into its decoded JSON, or a
:class:`ServerCallFailed` naming the server, the endpoint and vLLM's message. A session is opened
per call (``aiohttp``): the engine is called from whichever event loop its caller runs.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from plasmid.errors import ProviderError

CONTROL_TIMEOUT = 600.0


class ServerUnreachable(ConnectionError):
    """No HTTP answer from a server (connection refused or reset, or no answer in time)."""


class ServerCallFailed(ProviderError):
    """A server answered a call with a failure."""

    def __init__(self, message: str) -> None:
        super().__init__(message, provider="vllm", plugin="plasmid-vllm")


async def request(url: str, path: str, body: dict[str, Any] | None = None, *, method: str = "POST",
                  timeout: float | None = CONTROL_TIMEOUT) -> tuple[int, str]:
    """``method url+path`` with a JSON ``body``; ``(status, text)``.

    :raises ServerUnreachable: refused, dropped, or no answer within ``timeout`` seconds.
    """
    import aiohttp

    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
            async with session.request(method, url + path, json=body) as response:
                return response.status, await response.text()
    except (TimeoutError, aiohttp.ClientConnectionError) as exc:
        raise ServerUnreachable(f"{method} {url}{path}: {type(exc).__name__}: {exc}") from exc


def request_blocking(url: str, path: str, body: dict[str, Any] | None = None, *, method: str = "POST",
                     timeout: float | None = CONTROL_TIMEOUT) -> tuple[int, str]:
    """The blocking twin of :func:`request` (threads without an event loop)."""
    data = None if body is None else json.dumps(body).encode()
    call = urllib.request.Request(url + path, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(call, timeout=timeout) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode(errors="replace")
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
        raise ServerUnreachable(f"{method} {url}{path}: {type(exc).__name__}: {exc}") from exc


def expect_ok(url: str, path: str, status: int, text: str) -> Any:
    """The decoded answer of a control call, or :class:`ServerCallFailed` (an HTTP error, or
    ``"success": false``)."""
    try:
        answer = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        answer = {"message": text.strip()}
    if status != 200 or (isinstance(answer, dict) and answer.get("success") is False):
        message = (answer.get("message") or answer.get("error") or answer.get("detail")) \
            if isinstance(answer, dict) else answer
        raise ServerCallFailed(f"vLLM server {url}: {path} failed (HTTP {status}): {message or text.strip()[:500]}")
    return answer
