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

The transport is the kernel's (:mod:`plasmid.server_process`); this module names the errors.
"""

from __future__ import annotations

from typing import Any

from plasmid.errors import ProviderError
from plasmid.server_process import CONTROL_TIMEOUT, ServerUnreachable, control_answer, request, request_blocking

__all__ = ["CONTROL_TIMEOUT", "ServerCallFailed", "ServerUnreachable", "expect_success", "request", "request_blocking"]


class ServerCallFailed(ProviderError):
    """A server answered a call with a failure."""

    def __init__(self, message: str) -> None:
        super().__init__(message, provider="sglang", plugin="plasmid-sglang")


def expect_success(url: str, path: str, status: int, text: str) -> Any:
    """The decoded answer of a control call, or :class:`ServerCallFailed` when it failed
    (an HTTP error, or ``"success": false``)."""
    return control_answer(url, path, status, text, server="SGLang", error=ServerCallFailed)
