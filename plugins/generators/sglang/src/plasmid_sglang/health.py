"""The health monitor: a thread per engine that finds dead servers and restarts them.

Every ``--sglang-health-interval`` seconds, and at once when a request found a server silent
(:meth:`HealthMonitor.wake`), it looks at each server:

- a launched server whose process has exited is restarted;
- otherwise ``GET /health_generate`` (SGLang answers it by generating one token, or at once when
  it is busy generating anyway); :data:`FAILURES_BEFORE_RESTART` failures in a row restart a
  launched server, and put an attached one out of service (plasmid does not restart what it did
  not start).

A restart stops the process group, starts the server again (new port), waits until it is
healthy, and restores the engine's current weights and version from the journal
(:mod:`plasmid_sglang.journal`) before any request reaches it again; requests that were in
flight on it are retried by the engine. After ``--sglang-max-restarts`` restarts, or when the
weights cannot be restored, the server is out of service and requests fail with the reason.
Every event is reported on stderr.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

from plasmid_sglang.client import ServerUnreachable, request_blocking
from plasmid_sglang.pool import Server

#: Consecutive failed health checks of a running process before it is restarted.
FAILURES_BEFORE_RESTART = 3
#: Seconds a health check may take (SGLang's own generation check gives up after 20).
CHECK_TIMEOUT = 30.0


def report(message: str) -> None:
    print(f"plasmid-sglang: {message}", file=sys.stderr, flush=True)


class HealthMonitor:
    """Watches ``servers``; ``restore(server, old_url)`` puts the engine's weights back on a
    restarted one (and tells the router, if any, its new address)."""

    def __init__(self, servers: list[Server], *, interval: float, max_restarts: int, startup_timeout: float,
                 restore: Callable[[Server, str], None]) -> None:
        self.servers = servers
        self.interval = interval
        self.max_restarts = max_restarts
        self.startup_timeout = startup_timeout
        self.restore = restore
        self.failures = {server.index: 0 for server in servers}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="plasmid-sglang-health", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        """Look at the servers now (a request found one silent)."""
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=self.startup_timeout + 30)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(timeout=self.interval)
            self._wake.clear()
            for server in self.servers:
                if self._stop.is_set():
                    return
                if server.failure is None:
                    self.check(server)

    def check(self, server: Server) -> None:
        """One look at ``server`` (see the module docstring)."""
        if server.process is not None and not server.process.alive():
            code = server.process.process.returncode if server.process.process is not None else None
            self.restart(server, f"its process exited (code {code})")
            return
        try:
            status, _ = request_blocking(server.url, "/health_generate", method="GET", timeout=CHECK_TIMEOUT)
            healthy = status == 200
        except ServerUnreachable:
            healthy = False
        if healthy:
            self.failures[server.index] = 0
            server.suspect_since = None
            server.healthy.set()
            return
        server.mark_suspect()
        self.failures[server.index] += 1
        if self.failures[server.index] >= FAILURES_BEFORE_RESTART:
            self.failures[server.index] = 0
            self.restart(server, f"{FAILURES_BEFORE_RESTART} health checks in a row failed")
        else:
            self._wake.set()  # look again soon rather than after a whole interval

    def restart(self, server: Server, reason: str) -> None:
        server.healthy.clear()
        if server.process is None:
            server.failure = f"it stopped answering ({reason}); plasmid does not restart servers it did not launch"
            report(f"{server.name} is out of service: {server.failure}")
            return
        if server.restarts >= self.max_restarts:
            server.failure = f"{reason}, and it was restarted {server.restarts} times already " \
                             f"(--sglang-max-restarts {self.max_restarts}); see {server.process.log_path}"
            report(f"{server.name} is out of service: {server.failure}")
            return
        server.restarts += 1
        report(f"{server.name}: {reason}; restarting it (restart {server.restarts} of {self.max_restarts})")
        old_url = server.url
        try:
            server.process.stop()
            server.process.start()
            server.process.wait_healthy(self.startup_timeout)
            self.restore(server, old_url)
        except Exception as exc:  # noqa: BLE001 - reported and kept as the server's failure
            server.failure = f"the restart failed: {type(exc).__name__}: {exc}"
            report(f"{server.name} is out of service: {server.failure}")
            return
        server.suspect_since = None
        server.healthy.set()
        report(f"{server.name} is back, serving the engine's current weights")
