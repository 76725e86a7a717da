"""The servers behind one engine: their state, the choice of a server per request, waiting for one.

Requests go to the healthy server with the fewest requests in flight (ties: the first), each
server admitting at most ``max_concurrency`` at once (the rest wait in line here, so that a
burst never overloads a server's queue). A server that did not answer is *suspect*: no new
request is sent to it until the health monitor (:mod:`plasmid_serving.health`) has found it
healthy again or restarted it; requests that wait for it give up when it is marked failed.

Server state is shared between the event loop that calls the engine and the monitor's thread:
``healthy`` is a ``threading.Event`` and the counters are plain ints, changed on one thread each.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

from plasmid_serving.names import EngineNames
from plasmid_serving.server_process import ManagedServer


@dataclass(eq=False)
class Server:
    """One server: launched by its engine (``process``) or attached to (``address``).

    :ivar index: its position among the engine's servers.
    :ivar names: its engine's names (messages, errors).
    :ivar tp_size: its tensor-parallel ranks (each joins a distributed weight-update group).
    :ivar device: where it computes (``cpu`` or ``cuda``).
    :ivar can_release: whether its memory can be released and taken back (SGLang's memory
        saver, vLLM's sleep mode); never on ``cpu``.
    :ivar in_flight: ``generate`` calls assigned to it and not answered.
    :ivar requests: ``generate`` calls it answered.
    :ivar failure: why it cannot be used any more (a restart failed, an attached server died).
    """

    index: int
    names: EngineNames
    process: ManagedServer | None = None
    address: str = ""
    tp_size: int = 1
    device: str = "cpu"
    can_release: bool = False
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
        running = self.process.process if self.process is not None else None
        how = f"pid {running.pid}" if running is not None else "attached" if self.process is None else "stopped"
        return f"{self.names.label} server {self.index} ({self.url}, {how})"

    def mark_suspect(self) -> None:
        """No answer from it: hold new requests until the monitor has looked at it."""
        if self.healthy.is_set():
            self.suspect_since = time.monotonic()
        self.healthy.clear()

    def check_usable(self) -> None:
        """:raises ProviderError: it is out of service (the message says why)."""
        if self.failure is not None:
            raise self.names.error(f"{self.name} is out of service: {self.failure}")


class ServerPool:
    """The engine's servers and the per-event-loop admission semaphores and update locks."""

    def __init__(self, servers: list[Server], max_concurrency: int) -> None:
        self.servers = servers
        self.max_concurrency = max_concurrency
        self._loop: asyncio.AbstractEventLoop | None = None
        self._admission: dict[int, asyncio.Semaphore] = {}
        self._update_locks: dict[int, asyncio.Lock] = {}

    def choose(self) -> Server:
        """The server for the next request: healthy and least loaded (see the module docstring).

        :raises ProviderError: every server is out of service.
        """
        usable = self.usable()
        healthy = [s for s in usable if s.healthy.is_set()] or usable
        return min(healthy, key=lambda s: s.in_flight)

    def usable(self) -> list[Server]:
        """The servers in service (not failed), healthy or suspect.

        :raises ProviderError: none is (naming the first server's failure).
        """
        usable = [server for server in self.servers if server.failure is None]
        if not usable:
            self.servers[0].check_usable()
        return usable

    def admission(self, server: Server) -> asyncio.Semaphore:
        """The semaphore admitting at most ``max_concurrency`` requests to ``server`` at once."""
        self._bind()
        return self._admission.setdefault(server.index, asyncio.Semaphore(self.max_concurrency))

    def update_lock(self, server: Server) -> asyncio.Lock:
        """Serialises weight updates of one server (an update may be several calls)."""
        self._bind()
        return self._update_locks.setdefault(server.index, asyncio.Lock())

    async def wait_usable(self, server: Server, timeout: float) -> None:
        """Return once ``server`` is healthy; raise when it is marked failed or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        delay = 0.05
        while not server.healthy.is_set():
            server.check_usable()
            if time.monotonic() > deadline:
                raise server.names.error(f"{server.name} did not come back within {timeout:.0f} s")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
        server.check_usable()

    def _bind(self) -> None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._admission, self._update_locks = loop, {}, {}
