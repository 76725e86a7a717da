"""HTTP to an inference server: the calls an engine makes and the errors they raise.

:func:`request` (asynchronous, ``aiohttp`` imported when first used: the engines' event loop) and
:func:`request_blocking` (``urllib``: the health monitor's thread, start-up) both answer
``(status, body text)`` and raise :class:`ServerUnreachable` when no answer came (refused, reset,
timed out): the caller decides whether to wait for a restart and retry. A session is opened per
call: an engine is called from whichever event loop its caller runs (``asyncio.run`` makes a new
one per call in tests), and a session cannot outlive its loop; on 127.0.0.1 a connection costs
tens of microseconds, nothing next to a generation.

:func:`control_answer` decodes a control call's answer or raises the engine's
:class:`ServerCallFailed` naming the server, the endpoint and the server's message.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from plasmid.errors import ProviderError

#: Seconds to wait for a control call (weight updates, flushes) unless the caller says otherwise.
CONTROL_TIMEOUT = 600.0


class ServerUnreachable(ConnectionError):
    """No HTTP answer from a server (connection refused or reset, or no answer in time)."""


class ServerCallFailed(ProviderError):
    """A server answered a call with a failure (an HTTP error, ``"success": false``); raised by
    :meth:`plasmid_serving.engine.HttpEngine.expect` with the engine's provider and plugin names."""


async def request(url: str, path: str, body: dict[str, Any] | None = None, *, method: str = "POST",
                  timeout: float | None = CONTROL_TIMEOUT) -> tuple[int, str]:
    """``method url+path`` with a JSON ``body``; ``(status, text)``. A session is opened per call:
    callers run on whichever event loop they are given, and a session cannot outlive its loop.

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
    """The blocking twin of :func:`request` (for threads without an event loop); an HTTP error
    status is an answer, not an exception.

    :raises ServerUnreachable: as :func:`request`.
    """
    data = None if body is None else json.dumps(body).encode()
    call = urllib.request.Request(url + path, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(call, timeout=timeout) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode(errors="replace")
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
        raise ServerUnreachable(f"{method} {url}{path}: {type(exc).__name__}: {exc}") from exc


def control_answer(url: str, path: str, status: int, text: str, *, server: str,
                   error: Callable[[str], Exception], keys: Sequence[str] = ("message", "error"),
                   limit: int | None = None) -> Any:
    """The decoded JSON answer of a control call (``{}`` for an empty body, ``{"message": text}``
    for one that is not JSON).

    :raises Exception: ``error(message)`` when the call failed (HTTP status other than 200, or
        ``"success": false``); the message reads ``<server> server <url>: <path> failed (HTTP
        <status>): <reason>``, the reason being the first non-empty of ``keys`` in the answer, else
        the body (its first ``limit`` characters when ``limit`` is given).
    """
    try:
        answer = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        answer = {"message": text.strip()}
    if status != 200 or (isinstance(answer, dict) and answer.get("success") is False):
        message: Any = answer
        if isinstance(answer, dict):
            message = None
            for key in keys:
                message = message or answer.get(key)
        body = text.strip() if limit is None else text.strip()[:limit]
        raise error(f"{server} server {url}: {path} failed (HTTP {status}): {message or body}")
    return answer
