"""Pieces shared by plugins that drive an inference server over HTTP (plasmid-vllm, plasmid-sglang).

- :class:`ManagedServer`: the lifecycle of a server process launched in its own session (its own
  process group, so stopping the group stops every process the server starts): waiting for a
  health endpoint, SIGTERM then SIGKILL, reading the cause of a failed start out of its log.
  A plugin's ``ServerProcess`` dataclass subclasses it, sets the class attributes that name the
  engine and its health endpoint, and writes ``start`` (the command line is the plugin's) with
  :func:`spawn`.
- HTTP: :func:`request` (asynchronous, ``aiohttp`` imported when first used), :func:`request_blocking`
  (``urllib``, for threads without an event loop); both answer ``(status, body text)`` and raise
  :class:`ServerUnreachable` when no answer came. :func:`control_answer` decodes a control call's
  answer or raises the plugin's error naming the server, the endpoint and the server's message.
- :func:`stop_servers_at_exit` (an engine's launched servers stopped when the process exits
  without a shutdown), :func:`free_port`, :func:`kill_group`, :func:`checkpoint_dtype` (the dtype a server can serve a
  checkpoint in as it is) and :func:`logprob_at_temperature` (exact temperature rescaling of
  full-vocabulary log-probs).

No torch: everything here is standard library (plus ``aiohttp`` inside :func:`request`).
"""

from __future__ import annotations

import atexit
import json
import math
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from plasmid.errors import ProviderError

#: Seconds to wait for a control call (weight updates, flushes) unless the caller says otherwise.
CONTROL_TIMEOUT = 600.0


class ServerUnreachable(ConnectionError):
    """No HTTP answer from a server (connection refused or reset, or no answer in time)."""


async def request(url: str, path: str, body: dict[str, Any] | None = None, *, method: str = "POST",
                  timeout: float | None = CONTROL_TIMEOUT) -> tuple[int, str]:
    """``method url+path`` with a JSON ``body``; ``(status, text)``. A session is opened per call:
    callers run on whichever event loop they are given, and a session cannot outlive its loop.

    :raises ServerUnreachable: the server refused, dropped the connection or did not answer
        within ``timeout`` seconds (``None``: wait as long as it takes).
    """
    import aiohttp

    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
            async with session.request(method, url + path, json=body) as response:
                return response.status, await response.text()
    except (TimeoutError, aiohttp.ClientConnectionError) as exc:
        raise ServerUnreachable(f"{method} {url}{path}: {type(exc).__name__}: {exc}") from exc


def request_blocking(url: str, path: str, body: dict[str, Any] | None = None, *, method: str = "POST",
                     timeout: float | None = CONTROL_TIMEOUT) -> tuple[int, str]:
    """The blocking twin of :func:`request` (for threads without an event loop); an HTTP error
    status is an answer, not an exception.

    :raises ServerUnreachable: as :func:`request`.
    """
    data = None if body is None else json.dumps(body).encode()
    call = urllib.request.Request(url + path, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(call, timeout=timeout) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode(errors="replace")
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
        raise ServerUnreachable(f"{method} {url}{path}: {type(exc).__name__}: {exc}") from exc


def control_answer(url: str, path: str, status: int, text: str, *, server: str,
                   error: Callable[[str], Exception], keys: Sequence[str] = ("message", "error"),
                   limit: int | None = None) -> Any:
    """The decoded JSON answer of a control call (``{}`` for an empty body, ``{"message": text}``
    for one that is not JSON).

    :raises Exception: ``error(message)`` when the call failed (HTTP status other than 200, or
        ``"success": false``); the message reads ``<server> server <url>: <path> failed (HTTP
        <status>): <reason>``, the reason being the first non-empty of ``keys`` in the answer, else
        the body (its first ``limit`` characters when ``limit`` is given).
    """
    try:
        answer = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        answer = {"message": text.strip()}
    if status != 200 or (isinstance(answer, dict) and answer.get("success") is False):
        message: Any = answer
        if isinstance(answer, dict):
            message = None
            for key in keys:
                message = message or answer.get(key)
        body = text.strip() if limit is None else text.strip()[:limit]
        raise error(f"{server} server {url}: {path} failed (HTTP {status}): {message or body}")
    return answer


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def checkpoint_dtype(model_dir: str | Path, served: Sequence[str]) -> str:
    """The dtype of ``model_dir/config.json`` (``dtype``, else ``torch_dtype``, without a
    ``torch.`` prefix) when it is one of ``served``, else ``auto`` (also without a config)."""
    path = Path(model_dir) / "config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    dtype = str(config.get("dtype") or config.get("torch_dtype") or "auto").removeprefix("torch.")
    return dtype if dtype in served else "auto"


def logprob_at_temperature(logprobs: Mapping[int, float], token: int, temperature: float) -> float:
    """``log softmax(logits / T)[token]`` from ``logprobs = log softmax(logits)`` over the whole
    vocabulary (``{token id: log-prob}``), in float64."""
    scaled = {t: lp / temperature for t, lp in logprobs.items()}
    top = max(scaled.values())
    return scaled[token] - (top + math.log(sum(math.exp(v - top) for v in scaled.values())))


def kill_group(group: int) -> None:
    """SIGKILL process group ``group``; one that is gone (or not ours) is no error."""
    try:
        os.killpg(group, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def stop_servers_at_exit(owner: object, servers: Sequence[Any], closed: Callable[[Any], bool]) -> None:
    """When this process exits, ``server.process.stop(grace=2.0)`` for each of ``servers`` whose
    ``process`` is not ``None`` (a crash, a failed test: the owner was never shut down), unless
    ``owner`` was garbage-collected or ``closed(owner)`` is true by then. Holds ``owner`` weakly."""
    reference = weakref.ref(owner)

    def stop() -> None:
        alive = reference()
        if alive is not None and not closed(alive):
            for server in servers:
                if server.process is not None:
                    server.process.stop(grace=2.0)

    atexit.register(stop)


def spawn(command: list[str], log_path: Path, header: str, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """Start ``command`` in a new session (its own process group) with ``env``, stdin closed and
    stdout + stderr appended to ``log_path`` after the line ``header`` (both written before the
    process starts, so the header comes first); returns at once."""
    with open(log_path, "ab") as log:
        log.write(f"\n{header}\n".encode())
        log.flush()
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=dict(env), start_new_session=True)


class ManagedServer:
    """The lifecycle of one server process launched with :func:`spawn` (a mixin for a plugin's
    ``ServerProcess`` dataclass, which provides ``log_path``, ``port``, ``process`` and ``url``).

    Class attributes a subclass sets: ``label`` (``"vLLM"``: how messages name the server),
    ``provider`` / ``plugin`` (of the :class:`ProviderError` raised), ``timeout_option`` (the option
    a message tells the user to raise), ``health_path`` / ``health_timeout`` (the endpoint that
    answers 200 once the server is ready, seconds per probe), ``error_pattern`` with
    ``error_match`` (a log line is an error line when the pattern matches at its start, or when
    ``error_match`` is false anywhere in it), ``tail_skip`` (lines containing it are left out of
    :meth:`log_tail`).
    """

    label: ClassVar[str]
    provider: ClassVar[str]
    plugin: ClassVar[str]
    timeout_option: ClassVar[str]
    health_path: ClassVar[str]
    health_timeout: ClassVar[float]
    error_pattern: ClassVar[str] = r"(Error|Exception|error): "
    error_match: ClassVar[bool] = False
    tail_skip: ClassVar[str | None] = None

    log_path: Path
    port: int
    process: subprocess.Popen[bytes] | None

    @property
    def url(self) -> str:
        raise NotImplementedError

    def alive(self) -> bool:
        """Whether the process was started and has not exited."""
        return self.process is not None and self.process.poll() is None

    def wait_healthy(self, timeout: float) -> None:
        """Block until ``health_path`` answers 200 (polled once a second).

        :raises ProviderError: the process exited (the message names the error line of its log
            and holds the log's end), or was not healthy within ``timeout`` seconds (the server
            is stopped first; the message holds the log's end).
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                code = self.process.returncode if self.process is not None else None
                raise ProviderError(f"{self.label} server (port {self.port}) exited with code {code} while starting: "
                                    f"{self.log_error()}\nThe end of {self.log_path}:\n{self.log_tail()}",
                                    provider=self.provider, plugin=self.plugin)
            try:
                status, _ = request_blocking(self.url, self.health_path, method="GET", timeout=self.health_timeout)
                if status == 200:
                    return
            except ServerUnreachable:
                pass
            time.sleep(1.0)
        self.stop()
        raise ProviderError(f"{self.label} server (port {self.port}) was not healthy after {timeout:.0f} s "
                            f"(raise {self.timeout_option}); the end of {self.log_path}:\n{self.log_tail()}",
                            provider=self.provider, plugin=self.plugin)

    def terminate(self) -> None:
        """SIGTERM to the process itself (not its group) when it runs; does not wait."""
        if self.process is not None and self.process.poll() is None:
            try:
                os.kill(self.process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def stop(self, grace: float = 15.0) -> None:
        """:meth:`terminate`, up to ``grace`` seconds for it to exit, then SIGKILL to whatever is
        left of its process group; afterwards ``process`` is ``None``. Stopping twice is fine."""
        if self.process is None:
            return
        self.terminate()
        try:
            self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        kill_group(self.process.pid)
        try:
            self.process.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            pass
        self.process = None

    def kill(self) -> None:
        """SIGKILL the whole process group now (what a crash looks like; tests use it)."""
        if self.process is not None:
            kill_group(self.process.pid)
            self.process.wait(timeout=10)

    def log_error(self) -> str:
        """The last error line of the log (see ``error_pattern``), stripped: the cause of a failed
        start; ``"(no error line in the log)"`` when there is none, ``""`` when the log is unreadable."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        find = re.match if self.error_match else re.search
        causes = [line.strip() for line in lines if find(self.error_pattern, line)]
        return causes[-1] if causes else "(no error line in the log)"

    def log_tail(self, lines: int = 25) -> str:
        """The last ``lines`` lines of the log (without those containing ``tail_skip``), or
        ``"(no log)"`` when it is unreadable."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        skip = self.tail_skip
        useful = text if skip is None else [line for line in text if skip not in line]
        return "\n".join(useful[-lines:])
