"""One JSON POST over HTTP(S) with the standard library, and what can go wrong with it.

Blocking (``urllib``); the reward calls it from its own thread pool. ``timeout`` bounds the whole
request (connecting, sending, the headers and the body together), not each read: a server that
trickles its answer a byte at a time is cut off when the time is up (:class:`Deadline` shuts the
socket down from a timer thread). :meth:`Deadline.abort` ends a request at once from another
thread: the reward does it when its call is cancelled (a stop, ``--reward-timeout``), so no
thread is left waiting on a server when the process exits. Errors never contain the
bearer token: it is only ever put in the ``Authorization`` header, and any text that comes
back from the server is scrubbed of it before it reaches a message. URLs in messages are shown
without credentials or query string (:func:`safe_url`).
"""

from __future__ import annotations

import functools
import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

#: How much of a server's error body a message quotes.
BODY_EXCERPT = 200
#: What a time-out message says of the limit.
WHOLE = "(--rm-timeout bounds the whole request)"


class RemoteError(RuntimeError):
    """The server answered, but not with a usable result (4xx, not JSON, wrong shape). Not retried."""


class RetryableError(RuntimeError):
    """A connection error or a 5xx answer: worth retrying after a pause."""


class RemoteTimeout(RuntimeError):
    """No answer within ``--rm-timeout`` seconds. Not retried: the whole call is bounded by
    ``--reward-timeout``, and a slow server gets no extra load."""


class RemoteAborted(RuntimeError):
    """The request was ended by :meth:`Deadline.abort` (the call was cancelled)."""


class Deadline:
    """The time limit of one whole request, and a way to end it early from any thread: when it
    expires or is aborted, the request's sockets are shut down, which ends a blocking read."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds
        self.expired = False
        self.aborted = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None

    def start(self) -> None:
        """Start the clock now (the request begins)."""
        self.end = time.monotonic() + self.seconds
        self._timer = threading.Timer(self.seconds, self.expire)
        self._timer.daemon = True
        self._timer.start()

    def finish(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def remaining(self) -> float:
        return max(self.end - time.monotonic(), 0.001)

    @property
    def over(self) -> bool:
        return self.expired or self.aborted

    def attach(self, sock: socket.socket) -> None:
        """Shut ``sock`` down when the deadline passes (at once if it has)."""
        with self._lock:
            self._sockets.append(sock)
            over = self.over
        if over:
            self._cut()

    def expire(self) -> None:
        self.expired = True
        self._cut()

    def abort(self) -> None:
        self.aborted = True
        self._cut()

    def _cut(self) -> None:
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _Bounded(http.client.HTTPConnection):
    """A connection whose connect is bounded by the deadline's remaining time and whose socket
    the deadline shuts down."""

    deadline: Deadline

    def connect(self) -> None:
        if self.deadline.over:
            raise ConnectionAbortedError("the request's time is up")
        self.timeout = self.deadline.remaining()
        super().connect()
        self.deadline.attach(self.sock)


class _BoundedHTTP(_Bounded):
    def __init__(self, *args: Any, deadline: Deadline, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deadline = deadline


class _BoundedHTTPS(_Bounded, http.client.HTTPSConnection):
    def __init__(self, *args: Any, deadline: Deadline, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deadline = deadline


class _DeadlineHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def do_open(self, http_class: Any, req: Any, **kwargs: Any) -> Any:
        return super().do_open(functools.partial(_BoundedHTTP, deadline=self.deadline), req, **kwargs)


class _DeadlineHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def do_open(self, http_class: Any, req: Any, **kwargs: Any) -> Any:
        return super().do_open(functools.partial(_BoundedHTTPS, deadline=self.deadline), req, **kwargs)


def safe_url(url: str) -> str:
    """``url`` without user, password or query: what messages and logs show."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


def scrub(text: str, secret: str | None) -> str:
    return text.replace(secret, "***") if secret else text


def post_json(url: str, payload: Any, *, timeout: float, token: str | None = None,
              deadline: Deadline | None = None) -> Any:
    """POST ``payload`` as JSON to ``url``; the decoded JSON reply, within ``timeout`` seconds in all.

    ``deadline`` (made from ``timeout`` when not given; started here) lets another thread
    :meth:`~Deadline.abort` the request. Raises :class:`RetryableError` (connection
    refused/reset, 5xx), :class:`RemoteTimeout`, :class:`RemoteAborted`, or :class:`RemoteError`
    (other HTTP errors, a reply that is not JSON).
    """
    body = json.dumps(payload, default=str).encode()
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    where = f"POST {safe_url(url)}"
    deadline = deadline or Deadline(timeout)
    opener = urllib.request.build_opener(_DeadlineHTTPHandler(deadline), _DeadlineHTTPSHandler(deadline))

    def over() -> RuntimeError | None:
        if deadline.aborted:
            return RemoteAborted(f"{where}: the call was cancelled")
        if deadline.expired:
            return RemoteTimeout(f"{where}: no answer within {timeout:g}s {WHOLE}")
        return None

    deadline.start()
    try:
        try:
            with opener.open(request, timeout=timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            try:
                excerpt = scrub(exc.read()[:BODY_EXCERPT].decode(errors="replace"), token)
            except (OSError, http.client.HTTPException):
                excerpt = ""
            if (ended := over()) is not None:
                raise ended from None
            kind = RetryableError if exc.code >= 500 else RemoteError
            raise kind(f"{where}: HTTP {exc.code} {exc.reason}: {excerpt!r}") from None
        except (OSError, http.client.HTTPException) as exc:  # URLError and TimeoutError are OSErrors
            if (ended := over()) is not None:
                raise ended from None
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            if isinstance(reason, TimeoutError):
                raise RemoteTimeout(f"{where}: no answer within {timeout:g}s {WHOLE}") from None
            if isinstance(exc, urllib.error.URLError):
                raise RetryableError(f"{where}: {scrub(str(exc.reason), token)}") from None
            raise RetryableError(f"{where}: {type(exc).__name__}: {scrub(str(exc), token)}") from None
    finally:
        deadline.finish()
    if (ended := over()) is not None:  # a reply read to the connection's end may be cut short
        raise ended
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        excerpt = scrub(raw[:BODY_EXCERPT].decode(errors="replace"), token)
        raise RemoteError(f"{where}: the reply is not JSON: {excerpt!r}") from None
