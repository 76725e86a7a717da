"""A small HTTP/1.1 server on asyncio streams: enough of the protocol for OpenAI clients (httpx,
aiohttp, requests): keep-alive, ``Content-Length`` or chunked request bodies, JSON responses with
``Content-Length`` and streamed (server-sent events) responses with chunked transfer encoding.

Held against hostile clients (:class:`Limits`): a request's head is checked (``admit``: the
gateway's session key) before any of its body is read; body size (413), header size and count
(431) and idle time (408, or a quiet close of an idle keep-alive connection) are bounded; bad
framing (a ``Content-Length`` that is not a number, both it and ``Transfer-Encoding``, a bad chunk)
is a 400 answer, and nothing a client sends puts a traceback in the training log. HTTP/1.0
connections are closed after the answer.

Only the standard library: a gateway in front of local engines needs no web framework.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

#: Largest request body accepted by default (bytes): a long conversation, not a file upload.
MAX_BODY = 1 << 20
REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
           408: "Request Timeout", 413: "Payload Too Large", 431: "Request Header Fields Too Large",
           500: "Internal Server Error", 501: "Not Implemented", 503: "Service Unavailable"}


@dataclass(frozen=True)
class Limits:
    """What one request and one connection may take.

    :ivar max_body: request body bytes (413 beyond; a ``Content-Length`` over it is refused
        before anything of the body is read).
    :ivar max_header_bytes: bytes of the request line and headers together (431 beyond).
    :ivar max_headers: header fields (431 beyond).
    :ivar idle_timeout: seconds a connection may wait for its next request, and a request for
        its head in all or for each read of its body; then the connection is closed (a request
        begun but not finished gets 408 first).
    """

    max_body: int = MAX_BODY
    max_header_bytes: int = 64 << 10
    max_headers: int = 100
    idle_timeout: float = 60.0


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes = b""
    version: str = "HTTP/1.1"

    def json(self) -> Any:
        return json.loads(self.body or b"null")

    @property
    def keep_alive(self) -> bool:
        """HTTP/1.1 keeps the connection unless the client says ``close``; HTTP/1.0 closes it
        after the answer."""
        return self.version == "HTTP/1.1" and self.headers.get("connection", "").lower() != "close"


@dataclass
class Response:
    """A JSON response (``body``), or a stream of server-sent events (``events``: each item one
    ``data:`` payload, sent as it comes)."""

    status: int = 200
    body: Any = None
    events: AsyncIterator[str] | None = None
    headers: dict[str, str] = field(default_factory=dict)


Handler = Callable[[Request], Awaitable[Response]]
#: Called with a request's head (its ``body`` still empty) before the body is read: a response
#: refuses the request unread (an unknown key, a wrong route), ``None`` lets it through.
Admit = Callable[[Request], "Response | None"]


class HttpError(Exception):
    """A request the server refuses before a handler sees it."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def serve(handler: Handler, host: str = "127.0.0.1", port: int = 0, *, limits: Limits | None = None,
                admit: Admit | None = None) -> asyncio.Server:
    """Listen on ``host:port`` (0: a free port) and answer each request with ``handler``; a
    request ``admit`` refuses (checked on its head alone), or one over ``limits``, is answered
    without its body being read, and its connection closed."""
    limits = limits or Limits()

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    request = await read_head(reader, limits)
                    if request is None:
                        return
                    refusal = admit(request) if admit is not None else None
                    if refusal is not None:
                        await write_response(writer, refusal, keep_alive=False)
                        return
                    try:
                        request.body = await read_body(reader, request, limits)
                    except TimeoutError:
                        raise HttpError(408, f"the request's body stalled for {limits.idle_timeout:g}s") from None
                except HttpError as exc:
                    await write_response(writer, error_response(exc.status, str(exc)), keep_alive=False)
                    return
                keep_alive = request.keep_alive
                try:
                    response = await handler(request)
                except Exception as exc:  # noqa: BLE001 - the client gets a 500 naming it
                    response = error_response(500, f"{type(exc).__name__}: {exc}")
                await write_response(writer, response, keep_alive=keep_alive)
                if not keep_alive:
                    return
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            return
        except asyncio.CancelledError:  # the loop is ending with the connection open (a client kept it alive)
            return
        except Exception:  # noqa: BLE001 - a broken client never puts a traceback in the training log
            return
        finally:
            writer.close()

    return await asyncio.start_server(connection, host, port, limit=limits.max_header_bytes + 1024)


async def read_head(reader: asyncio.StreamReader, limits: Limits) -> Request | None:
    """The request line and headers of the next request (``body`` empty), or None when the
    client closed the connection or left it idle past ``limits.idle_timeout``."""
    try:
        async with asyncio.timeout(limits.idle_timeout):
            line = await reader.readline()
    except TimeoutError:
        return None  # an idle keep-alive connection: closed without a word, as servers do
    except ValueError:  # a line past the stream's limit
        raise HttpError(431, f"request line over {limits.max_header_bytes} bytes") from None
    if not line:
        return None
    try:
        async with asyncio.timeout(limits.idle_timeout):
            return await _parse_head(line, reader, limits)
    except TimeoutError:
        raise HttpError(408, f"the request's head did not arrive within {limits.idle_timeout:g}s") from None


async def _parse_head(line: bytes, reader: asyncio.StreamReader, limits: Limits) -> Request:
    size = len(line)
    if size > limits.max_header_bytes:
        raise HttpError(431, f"request line over {limits.max_header_bytes} bytes")
    parts = line.decode("latin-1").split()
    if len(parts) != 3 or parts[2] not in ("HTTP/1.0", "HTTP/1.1"):
        raise HttpError(400, f"malformed request line {line[:80]!r}")
    method, path, version = parts
    headers: dict[str, str] = {}
    count = 0
    while True:
        try:
            header = await reader.readline()
        except ValueError:
            raise HttpError(431, f"request headers over {limits.max_header_bytes} bytes") from None
        size += len(header)
        if size > limits.max_header_bytes:
            raise HttpError(431, f"request headers over {limits.max_header_bytes} bytes")
        if header in (b"\r\n", b"\n"):
            break
        if not header.endswith(b"\n"):
            raise asyncio.IncompleteReadError(header, None)  # the client closed mid-head
        count += 1
        if count > limits.max_headers:
            raise HttpError(431, f"more than {limits.max_headers} request headers")
        name, colon, value = header.decode("latin-1").partition(":")
        name = name.strip().lower()
        if not colon or not name or any(c in name for c in " \t"):
            raise HttpError(400, f"malformed header line {header[:80]!r}")
        value = value.strip()
        if name in headers and name in ("content-length", "transfer-encoding", "host", "authorization"):
            if name == "content-length" and headers[name] == value:
                continue
            raise HttpError(400, f"the {name} header is given twice")
        headers[name] = value
    return Request(method, path, headers, b"", version)


def _length(value: str, limits: Limits) -> int:
    if not value.isascii() or not value.isdigit() or len(value) > 20:
        raise HttpError(400, f"bad Content-Length {value[:40]!r}")
    length = int(value)
    if length > limits.max_body:
        raise HttpError(413, f"request body of {length} bytes is over {limits.max_body} (--agent-max-body)")
    return length


async def read_body(reader: asyncio.StreamReader, request: Request, limits: Limits) -> bytes:
    """The body of ``request`` (whose head was read), ``Content-Length`` or chunked, within the
    limits; bad framing is an :class:`HttpError` (400), never another exception."""
    headers = request.headers
    encoding = headers.get("transfer-encoding")
    if encoding is not None:
        if "content-length" in headers:
            raise HttpError(400, "a request may not have both Transfer-Encoding and Content-Length")
        if encoding.lower() != "chunked":
            raise HttpError(501, f"unsupported Transfer-Encoding {encoding[:40]!r} (the gateway reads chunked)")
        return await _read_chunked(reader, limits)
    length = _length(headers.get("content-length", "0"), limits)
    if not length:
        return b""
    async with asyncio.timeout(limits.idle_timeout) as deadline:
        body = bytearray()
        while len(body) < length:
            piece = await reader.read(min(length - len(body), 1 << 16))
            if not piece:
                raise asyncio.IncompleteReadError(bytes(body), length)
            body += piece
            deadline.reschedule(asyncio.get_running_loop().time() + limits.idle_timeout)  # idle, not total
    return bytes(body)


async def _read_chunked(reader: asyncio.StreamReader, limits: Limits) -> bytes:
    body = bytearray()
    async with asyncio.timeout(limits.idle_timeout) as deadline:
        while True:
            line = await reader.readline()
            if not line.endswith(b"\n"):
                raise asyncio.IncompleteReadError(line, None)
            text = line.split(b";")[0].strip()
            if not text or len(text) > 16 or any(c not in b"0123456789abcdefABCDEF" for c in text):
                raise HttpError(400, f"bad chunk size {line[:40]!r}")
            size = int(text, 16)
            if size == 0:
                trailers = 0
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    trailers += 1
                    if trailers > limits.max_headers:
                        raise HttpError(431, f"more than {limits.max_headers} trailer lines")
                return bytes(body)
            if len(body) + size > limits.max_body:
                raise HttpError(413, f"request body over {limits.max_body} bytes (--agent-max-body)")
            body += await reader.readexactly(size)
            if (await reader.readexactly(2)) != b"\r\n":
                raise HttpError(400, "a chunk does not end with CRLF")
            deadline.reschedule(asyncio.get_running_loop().time() + limits.idle_timeout)


def error_response(status: int, message: str, kind: str = "invalid_request_error") -> Response:
    """OpenAI's error shape: ``{"error": {"message", "type", "code"}}``."""
    return Response(status, {"error": {"message": message, "type": kind, "code": status}})


async def write_response(writer: asyncio.StreamWriter, response: Response, *, keep_alive: bool) -> None:
    reason = REASONS.get(response.status, "OK")
    head = [f"HTTP/1.1 {response.status} {reason}", f"Connection: {'keep-alive' if keep_alive else 'close'}"]
    head += [f"{name}: {value}" for name, value in response.headers.items()]
    if response.events is None:
        payload = json.dumps(response.body).encode()
        head += ["Content-Type: application/json", f"Content-Length: {len(payload)}"]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + payload)
        await writer.drain()
        return
    head += ["Content-Type: text/event-stream", "Cache-Control: no-cache", "Transfer-Encoding: chunked"]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
    async for event in response.events:
        data = f"data: {event}\n\n".encode()
        writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        await writer.drain()
    writer.write(b"0\r\n\r\n")
    await writer.drain()
