"""The lifecycle of an inference server process that an engine launches.

- :class:`ManagedServer`: a server process launched in its own session (its own process group,
  so stopping the group stops every process the server starts): waiting for a health endpoint,
  SIGTERM then SIGKILL, reading the cause of a failed start out of its log. A plugin's
  ``ServerProcess`` dataclass subclasses it, sets the class attributes that name the engine and
  its health endpoint, and writes ``start`` (the command line is the plugin's) with :func:`spawn`.
- :func:`stop_servers_at_exit` (an engine's launched servers stopped when the process exits
  without a shutdown), :func:`free_port`, :func:`kill_group`, :func:`checkpoint_dtype` (the
  dtype a server can serve a checkpoint in as it is).

The HTTP calls are :mod:`plasmid_serving.http`. No torch: standard library only.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import signal
import socket
import subprocess
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from plasmid.errors import ProviderError
from plasmid_serving.http import ServerUnreachable, request_blocking


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


#: Checkpoint dtypes that SGLang and vLLM serve as they are (others: ``auto``, the server's choice).
SERVED_DTYPES = ("float32", "bfloat16", "float16")


def checkpoint_dtype(model_dir: str | Path, served: Sequence[str] = SERVED_DTYPES) -> str:
    """The dtype of ``model_dir/config.json`` (``dtype``, else ``torch_dtype``, without a
    ``torch.`` prefix) when it is one of ``served``, else ``auto`` (also without a config)."""
    path = Path(model_dir) / "config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    dtype = str(config.get("dtype") or config.get("torch_dtype") or "auto").removeprefix("torch.")
    return dtype if dtype in served else "auto"


def detect_device() -> str:
    """``cuda`` when torch sees a GPU, else ``cpu`` (imports torch: call it when launching only)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


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
        """``http://host:port`` of the running server."""
        raise NotImplementedError

    def start(self) -> None:
        """Start the process (the plugin's command line, through :func:`spawn`); returns at once."""
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

    def freeze(self) -> Callable[[], None]:
        """Stop every process of the server (``SIGSTOP`` to its process group: it answers nothing,
        though connections to it still open) until the returned function continues them
        (``SIGCONT``; calling it twice is fine). For tests of what a stuck server does to its callers.

        :raises ProviderError: the server is not running."""
        if not self.alive() or self.process is None:
            raise ProviderError(f"{self.label} server (port {self.port}) is not running: nothing to freeze",
                                provider=self.provider, plugin=self.plugin)
        group = self.process.pid
        os.killpg(group, signal.SIGSTOP)

        def thaw() -> None:
            try:
                os.killpg(group, signal.SIGCONT)
            except ProcessLookupError:
                pass

        return thaw

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
