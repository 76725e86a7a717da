"""HTTP calls to an SGLang server: asynchronous (the engine) and blocking (the health monitor).

Both answer ``(status, body)`` and raise :class:`ServerUnreachable` when no answer came (refused,
reset, timed out): the caller decides whether to wait for a restart and retry.
:func:`expect_success` turns an SGLang control answer (``{"success": bool, "message": str}`` or
a plain status) into a result or a :class:`ServerCallFailed` that names the server, the endpoint
and SGLang's message.

The asynchronous client opens a session per call (``aiohttp``, imported when first used): the
engine is called from whichever event loop its caller runs (``asyncio.run`` makes a new one per
call in tests), and a session cannot outlive its loop. On 127.0.0.1 a connection costs tens of
microseconds, nothing next to a generation.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from plasmid.errors import ProviderError

#: Seconds to wait for a control call (weight updates, flushes) unless the caller says otherwise.
CONTROL_TIMEOUT = 600.0


class ServerUnreachable(ConnectionError):
    """No HTTP answer from a server (connection refused or reset, or no answer in time)."""


class ServerCallFailed(ProviderError):
    """A server answered a call with a failure."""

    def __init__(self, message: str) -> None:
        super().__init__(message, provider="sglang", plugin="plasmid-sglang")


async def request(url: str, path: str, body: dict[str, Any] | None = None, *, method: str = "POST",
                  timeout: float | None = CONTROL_TIMEOUT) -> tuple[int, str]:
    """``method url+path`` with a JSON ``body``; ``(status, text)``.

    :raises ServerUnreachable: the server refused, dropped the connection or did not answer
        within ``timeout`` seconds (``None``: wait as long as it takes).
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
    """The blocking twin of :func:`request` (for threads without an event loop)."""
    data = None if body is None else json.dumps(body).encode()
    call = urllib.request.Request(url + path, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(call, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
        raise ServerUnreachable(f"{method} {url}{path}: {type(exc).__name__}: {exc}") from exc


def expect_success(url: str, path: str, status: int, text: str) -> Any:
    """The decoded answer of a control call, or :class:`ServerCallFailed` when it failed
    (an HTTP error, or ``"success": false``)."""
    try:
        answer = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        answer = {"message": text.strip()}
    failed = status != 200 or (isinstance(answer, dict) and answer.get("success") is False)
    if failed:
        message = answer.get("message") or answer.get("error") if isinstance(answer, dict) else answer
        raise ServerCallFailed(f"SGLang server {url}: {path} failed (HTTP {status}): {message or text.strip()}")
    return answer
