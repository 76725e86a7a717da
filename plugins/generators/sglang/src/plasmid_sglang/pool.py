"""The servers behind one engine: their state, the choice of a server per request, waiting for one.

Requests go to the healthy server with the fewest requests in flight (ties: the first), each
server admitting at most ``--sglang-max-concurrency`` at once (the rest wait in line here, so
that a burst never overloads a server's queue). A server that did not answer is *suspect*: no
new request is sent to it until the health monitor (:mod:`plasmid_sglang.health`) has found it
healthy again or restarted it; requests that wait for it give up when it is marked failed.

Server state is shared between the event loop that calls the engine and the monitor's thread:
``healthy`` is a ``threading.Event`` and the counters are plain ints, changed on one thread each.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

from plasmid.errors import ProviderError
from plasmid_sglang.server import ServerProcess


@dataclass
class Server:
    """One SGLang server: launched by this engine (``process``) or attached to (``address``).

    :ivar index: its position among the engine's servers.
    :ivar tp_size: its tensor-parallel ranks (each joins a distributed weight-update group).
    :ivar device: where it computes (``cpu`` or ``cuda``).
    :ivar memory_saver: whether it runs with ``enable_memory_saver`` (memory can be released).
    :ivar in_flight: ``generate`` calls assigned to it and not answered.
    :ivar requests: ``generate`` calls it answered.
    :ivar failure: why it cannot be used any more (a restart failed, an attached server died).
    """

    index: int
    process: ServerProcess | None = None
    address: str = ""
    tp_size: int = 1
    device: str = "cpu"
    memory_saver: bool = False
    in_flight: int = 0
    requests: int = 0
    restarts: int = 0
    failure: str | None = None
    healthy: threading.Event = field(default_factory=threading.Event)
    suspect_since: float | None = None

    @property
    def url(self) -> str:
        return self.process.url if self.process is not None else self.address

    @property
    def name(self) -> str:
        how = f"pid {self.process.process.pid}" if self.process is not None and self.process.process else "attached"
        return f"SGLang server {self.index} ({self.url}, {how})"

    def mark_suspect(self) -> None:
        """No answer from it: hold new requests until the monitor has looked at it."""
        if self.healthy.is_set():
            self.suspect_since = time.monotonic()
        self.healthy.clear()

    def check_usable(self) -> None:
        if self.failure is not None:
            raise ProviderError(f"{self.name} is out of service: {self.failure}", provider="sglang",
                                plugin="plasmid-sglang")


class ServerPool:
    """The engine's servers and the per-event-loop admission semaphores."""

    def __init__(self, servers: list[Server], max_concurrency: int) -> None:
        self.servers = servers
        self.max_concurrency = max_concurrency
        self._loop: asyncio.AbstractEventLoop | None = None
        self._admission: dict[int, asyncio.Semaphore] = {}
        self._update_locks: dict[int, asyncio.Lock] = {}

    def choose(self) -> Server:
        """The server for the next request: healthy and least loaded (see the module docstring)."""
        usable = [s for s in self.servers if s.failure is None]
        if not usable:
            self.servers[0].check_usable()
        healthy = [s for s in usable if s.healthy.is_set()] or usable
        return min(healthy, key=lambda s: s.in_flight)

    def admission(self, server: Server) -> asyncio.Semaphore:
        self._bind()
        return self._admission.setdefault(server.index, asyncio.Semaphore(self.max_concurrency))

    def update_lock(self, server: Server) -> asyncio.Lock:
        """Serialises weight updates of one server (each is several calls: pause, begin, load, end)."""
        self._bind()
        return self._update_locks.setdefault(server.index, asyncio.Lock())

    async def wait_usable(self, server: Server, timeout: float) -> None:
        """Return once ``server`` is healthy; raise when it is marked failed or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        delay = 0.05
        while not server.healthy.is_set():
            server.check_usable()
            if time.monotonic() > deadline:
                raise ProviderError(f"{server.name} did not come back within {timeout:.0f} s", provider="sglang",
                                    plugin="plasmid-sglang")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
        server.check_usable()

    def _bind(self) -> None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._admission, self._update_locks = loop, {}, {}
