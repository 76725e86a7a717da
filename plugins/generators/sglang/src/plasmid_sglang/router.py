"""The optional SGLang router (``--sglang-router``; package ``sglang-router``) in front of an engine's servers.

Without it, the engine sends each request to its least loaded healthy server itself
(:mod:`plasmid_serving.pool`). With it, the engine starts ``python -m sglang_router.launch_router``
on 127.0.0.1 with its servers as workers (``--sglang-router-policy``, default ``cache_aware``:
requests sharing a prefix go to the server that has it cached) and sends ``/generate`` through it;
control calls (weight updates, flushes, aborts, memory) still go to every server directly. When
the health monitor restarts a server (on a new port), the engine replaces that worker in the
router (``DELETE /workers/{id}``, ``POST /workers``). The router itself is not restarted: if it
dies, requests fail after their retries.

Verified with sglang-router 0.3.2 (its HTTP API: ``GET /workers``, ``POST /workers`` with
``{"url": ...}``, ``DELETE /workers/{id}``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from plasmid.errors import ProviderError, UsageError
from plasmid_serving.http import ServerUnreachable, request_blocking
from plasmid_sglang.server import free_port


class Router:
    """One ``sglang_router`` process; :meth:`start`, then :attr:`url` takes ``/generate`` requests."""

    def __init__(self, policy: str, extra_args: list[str], log_path: Path, env: dict[str, str]) -> None:
        self.policy = policy
        self.extra_args = extra_args
        self.log_path = log_path
        self.env = env
        self.port = 0
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, worker_urls: list[str], timeout: float) -> None:
        """Start the router with ``worker_urls`` and wait until it reports every one healthy."""
        import importlib.util

        if importlib.util.find_spec("sglang_router") is None:
            raise UsageError("--sglang-router needs the sglang-router package (pip install sglang-router), "
                             "or leave it off: the engine balances requests over its servers itself")
        self.port = free_port()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port",
                   str(self.port), "--policy", self.policy, "--worker-urls", *worker_urls, *self.extra_args]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env={**os.environ, **self.env}, start_new_session=True)
        self.wait_for(set(worker_urls), timeout)

    def workers(self) -> list[dict]:
        status, text = request_blocking(self.url, "/workers", method="GET", timeout=10)
        return json.loads(text).get("workers", []) if status == 200 else []

    def wait_for(self, urls: set[str], timeout: float) -> None:
        """Block until the router lists every URL of ``urls`` as a healthy worker."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise ProviderError(f"the SGLang router exited with code {self.process.returncode}; see "
                                    f"{self.log_path}", provider="sglang", plugin="plasmid-sglang")
            try:
                healthy = {w["url"] for w in self.workers() if w.get("is_healthy")}
                if urls <= healthy:
                    return
            except (ServerUnreachable, ValueError):
                pass
            time.sleep(0.5)
        raise ProviderError(f"the SGLang router on port {self.port} did not list {sorted(urls)} as healthy within "
                            f"{timeout:.0f} s; see {self.log_path}", provider="sglang", plugin="plasmid-sglang")

    def replace_worker(self, old_url: str, new_url: str, timeout: float) -> None:
        """Swap a restarted server's old address for its new one."""
        for worker in self.workers():
            if worker.get("url") == old_url:
                request_blocking(self.url, f"/workers/{worker['id']}", method="DELETE", timeout=30)
        status, text = request_blocking(self.url, "/workers", {"url": new_url}, timeout=30)
        if status not in (200, 201, 202):
            raise ProviderError(f"the SGLang router refused worker {new_url}: HTTP {status} {text.strip()[:200]}",
                                provider="sglang", plugin="plasmid-sglang")
        self.wait_for({new_url}, timeout)

    def stop(self) -> None:
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process = None
