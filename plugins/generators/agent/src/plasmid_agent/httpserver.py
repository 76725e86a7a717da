"""A small HTTP/1.1 server on asyncio streams: enough of the protocol for OpenAI clients (httpx,
aiohttp, requests): keep-alive, ``Content-Length`` or chunked request bodies, JSON responses with
``Content-Length`` and streamed (server-sent events) responses with chunked transfer encoding.

Only the standard library: a gateway in front of local engines needs no web framework.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

#: Largest request body accepted (bytes): a long conversation, not a file upload.
MAX_BODY = 64 << 20
REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
           408: "Request Timeout", 413: "Payload Too Large", 500: "Internal Server Error",
           503: "Service Unavailable"}


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body or b"null")


@dataclass
class Response:
    """A JSON response (``body``), or a stream of server-sent events (``events``: each item one
    ``data:`` payload, sent as it comes)."""

    status: int = 200
    body: Any = None
    events: AsyncIterator[str] | None = None
    headers: dict[str, str] = field(default_factory=dict)


Handler = Callable[[Request], Awaitable[Response]]


class HttpError(Exception):
    """A request the server refuses before a handler sees it."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def serve(handler: Handler, host: str = "127.0.0.1", port: int = 0) -> asyncio.Server:
    """Listen on ``host:port`` (0: a free port) and answer each request with ``handler``."""

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    request = await read_request(reader)
                except HttpError as exc:
                    await write_response(writer, error_response(exc.status, str(exc)), keep_alive=False)
                    return
                if request is None:
                    return
                keep_alive = request.headers.get("connection", "").lower() != "close"
                try:
                    response = await handler(request)
                except Exception as exc:  # noqa: BLE001 - the client gets a 500 naming it
                    response = error_response(500, f"{type(exc).__name__}: {exc}")
                await write_response(writer, response, keep_alive=keep_alive)
                if not keep_alive:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        except asyncio.CancelledError:  # the loop is ending with the connection open (a client kept it alive)
            return
        finally:
            writer.close()

    return await asyncio.start_server(connection, host, port)


async def read_request(reader: asyncio.StreamReader) -> Request | None:
    """The next request on the connection, or None when the client closed it."""
    line = await reader.readline()
    if not line:
        return None
    parts = line.decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise HttpError(400, f"malformed request line {line[:80]!r}")
    method, path, _ = parts
    headers: dict[str, str] = {}
    while True:
        header = await reader.readline()
        if header in (b"\r\n", b"\n", b""):
            break
        name, _, value = header.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = bytearray()
        while True:
            size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass
                break
            body += await reader.readexactly(size)
            await reader.readexactly(2)
            if len(body) > MAX_BODY:
                raise HttpError(413, f"request body over {MAX_BODY} bytes")
        return Request(method, path, headers, bytes(body))
    length = int(headers.get("content-length", "0") or 0)
    if length > MAX_BODY:
        raise HttpError(413, f"request body of {length} bytes is over {MAX_BODY}")
    return Request(method, path, headers, await reader.readexactly(length) if length else b"")


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
