"""The health monitor: a thread per engine that finds dead servers and restarts them.

Every ``interval`` seconds, and at once when a request found a server silent
(:meth:`HealthMonitor.wake`), it looks at each server it watches (launched ones; attached ones
too when ``watch_attached``):

- a launched server whose process has exited is restarted;
- otherwise ``GET <health_path>``; ``failures_before_restart`` failures in a row restart a
  launched server, and put an attached one out of service (plasmid does not restart what it did
  not start).

A restart stops the process group (``stop_grace`` seconds for it to exit), starts the server
again (new port), waits until it is healthy, and calls ``restore(server, old_url)``, which puts
the engine's current weights and version back, before any request reaches it again; requests
that were in flight on it are retried by the engine. After ``max_restarts`` restarts, or when
the restore fails, the server is out of service and requests fail with the reason. Every event
is reported on stderr.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from plasmid_serving.http import ServerUnreachable, request_blocking
from plasmid_serving.pool import Server

#: Seconds a health check may take (SGLang's own generation check gives up after 20).
CHECK_TIMEOUT = 30.0


@dataclass(frozen=True)
class HealthPolicy:
    """How an engine's servers are watched (see the module docstring); set by the engine class.

    :ivar health_path: the endpoint that answers 200 while a server can serve.
    :ivar failures_before_restart: failed checks in a row of a running process before a restart.
    :ivar watch_attached: whether attached servers are checked (and put out of service) too.
    :ivar stop_grace: seconds a restarted server's process gets to exit before SIGKILL.
    """

    health_path: str
    failures_before_restart: int = 3
    watch_attached: bool = True
    stop_grace: float = 15.0


class HealthMonitor:
    """Watches ``servers`` with ``policy``; ``restore(server, old_url)`` puts the engine's
    weights back on a restarted one (and tells a router, if any, its new address)."""

    def __init__(self, servers: list[Server], policy: HealthPolicy, *, interval: float, max_restarts: int,
                 startup_timeout: float, restore: Callable[[Server, str], None]) -> None:
        self.servers = servers
        self.policy = policy
        self.interval = interval
        self.max_restarts = max_restarts
        self.startup_timeout = startup_timeout
        self.restore = restore
        self.failures = {server.index: 0 for server in servers}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="plasmid-serving-health", daemon=True)

    def watches(self, server: Server) -> bool:
        """Whether this monitor looks at ``server`` (else a suspect server is retried directly)."""
        return server.process is not None or self.policy.watch_attached

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
                if server.failure is None and self.watches(server):
                    self.check(server)

    def check(self, server: Server) -> None:
        """One look at ``server`` (see the module docstring)."""
        if server.process is not None and not server.process.alive():
            code = server.process.process.returncode if server.process.process is not None else None
            self.restart(server, f"its process exited (code {code})")
            return
        try:
            status, _ = request_blocking(server.url, self.policy.health_path, method="GET", timeout=CHECK_TIMEOUT)
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
        if self.failures[server.index] >= self.policy.failures_before_restart:
            self.failures[server.index] = 0
            self.restart(server, f"{self.policy.failures_before_restart} health checks in a row failed")
        else:
            self._wake.set()  # look again soon rather than after a whole interval

    def restart(self, server: Server, reason: str) -> None:
        """Restart ``server`` and restore its weights, or put it out of service (see the module docstring)."""
        server.healthy.clear()
        report = server.names.report
        if server.process is None:
            server.failure = f"it stopped answering ({reason}); plasmid does not restart servers it did not launch"
            report(f"{server.name} is out of service: {server.failure}")
            return
        if server.restarts >= self.max_restarts:
            server.failure = f"{reason}, and it was restarted {server.restarts} times already " \
                             f"(--{server.names.provider}-max-restarts {self.max_restarts}); " \
                             f"see {server.process.log_path}"
            report(f"{server.name} is out of service: {server.failure}")
            return
        server.restarts += 1
        report(f"{server.name}: {reason}; restarting it (restart {server.restarts} of {self.max_restarts})")
        old_url = server.url
        try:
            server.process.stop(grace=self.policy.stop_grace)
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
