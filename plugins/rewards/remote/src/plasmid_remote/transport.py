"""One JSON POST over HTTP(S) with the standard library, and what can go wrong with it.

Blocking (``urllib``); the reward calls it from its own thread pool. Errors never contain the
bearer token: it is only ever put in the ``Authorization`` header, and any text that comes
back from the server is scrubbed of it before it reaches a message. URLs in messages are shown
without credentials or query string (:func:`safe_url`).
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

#: How much of a server's error body a message quotes.
BODY_EXCERPT = 200


class RemoteError(RuntimeError):
    """The server answered, but not with a usable result (4xx, not JSON, wrong shape). Not retried."""


class RetryableError(RuntimeError):
    """A connection error or a 5xx answer: worth retrying after a pause."""


class RemoteTimeout(RuntimeError):
    """No answer within ``--rm-timeout`` seconds. Not retried: the whole call is bounded by
    ``--reward-timeout``, and a slow server gets no extra load."""


def safe_url(url: str) -> str:
    """``url`` without user, password or query: what messages and logs show."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


def scrub(text: str, secret: str | None) -> str:
    return text.replace(secret, "***") if secret else text


def post_json(url: str, payload: Any, *, timeout: float, token: str | None = None) -> Any:
    """POST ``payload`` as JSON to ``url``; the decoded JSON reply.

    Raises :class:`RetryableError` (connection refused/reset, 5xx), :class:`RemoteTimeout`,
    or :class:`RemoteError` (other HTTP errors, a reply that is not JSON).
    """
    body = json.dumps(payload, default=str).encode()
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    where = f"POST {safe_url(url)}"
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
    except urllib.error.HTTPError as exc:
        excerpt = scrub(exc.read()[:BODY_EXCERPT].decode(errors="replace"), token)
        kind = RetryableError if exc.code >= 500 else RemoteError
        raise kind(f"{where}: HTTP {exc.code} {exc.reason}: {excerpt!r}") from None
    except TimeoutError as exc:
        raise RemoteTimeout(f"{where}: no answer within {timeout:g}s (--rm-timeout)") from exc
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise RemoteTimeout(f"{where}: no answer within {timeout:g}s (--rm-timeout)") from None
        raise RetryableError(f"{where}: {scrub(str(exc.reason), token)}") from None
    except (ConnectionError, http.client.HTTPException) as exc:
        raise RetryableError(f"{where}: {type(exc).__name__}: {scrub(str(exc), token)}") from None
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        excerpt = scrub(raw[:BODY_EXCERPT].decode(errors="replace"), token)
        raise RemoteError(f"{where}: the reply is not JSON: {excerpt!r}") from None

