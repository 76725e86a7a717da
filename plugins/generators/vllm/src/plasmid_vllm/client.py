"""HTTP calls to a vLLM server: asynchronous (the engine) and blocking (start-up, the health monitor).

Both answer ``(status, body text)`` and raise :class:`ServerUnreachable` when no answer came
(refused, reset, timed out): the caller decides whether to wait for a restart and retry.
:func:`expect_ok` turns a control call's answer into its decoded JSON, or a
:class:`ServerCallFailed` naming the server, the endpoint and vLLM's message. A session is opened
per call (``aiohttp``): the engine is called from whichever event loop its caller runs.

The transport is the kernel's (:mod:`plasmid.server_process`); this module names the errors.
"""

from __future__ import annotations

from typing import Any

from plasmid.errors import ProviderError
from plasmid.server_process import CONTROL_TIMEOUT, ServerUnreachable, control_answer, request, request_blocking

__all__ = ["CONTROL_TIMEOUT", "ServerCallFailed", "ServerUnreachable", "expect_ok", "request", "request_blocking"]


class ServerCallFailed(ProviderError):
    """A server answered a call with a failure."""

    def __init__(self, message: str) -> None:
        super().__init__(message, provider="vllm", plugin="plasmid-vllm")


def expect_ok(url: str, path: str, status: int, text: str) -> Any:
    """The decoded answer of a control call, or :class:`ServerCallFailed` (an HTTP error, or
    ``"success": false``)."""
    return control_answer(url, path, status, text, server="vLLM", error=ServerCallFailed,
                          keys=("message", "error", "detail"), limit=500)
