"""Launching SGLang servers, waiting for them to be healthy, and stopping them.

A server runs ``python -m plasmid_sglang.launch SPEC.json`` (see :mod:`plasmid_sglang.launch`)
in a new session (its own process group: SGLang starts a scheduler and a detokenizer process,
and stopping the group stops them all), with its output in ``<log dir>/server-<n>.log``. It is
healthy when ``GET /health_generate`` answers 200 (SGLang generates one token to answer it).

:func:`server_fields` decides every ``ServerArgs`` value: the ``--sglang-*`` options given, and
for those not given, plasmid's own choices (:data:`plasmid_sglang.native.PLASMID_DEFAULTS`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plasmid.config import Config
from plasmid.errors import ProviderError
from plasmid.kernel_options import GeneralOptions, ScheduleOptions
from plasmid.native_options import given_values
from plasmid_sglang.client import ServerUnreachable, request_blocking
from plasmid_sglang.native import native_fields

#: KV-cache tokens of a CPU server when --sglang-max-total-tokens is not given.
CPU_MAX_TOTAL_TOKENS = 16384
#: Checkpoint dtypes that SGLang can serve as they are.
SERVED_DTYPES = ("float32", "bfloat16", "float16")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def checkpoint_dtype(model_dir: str | Path) -> str:
    """The dtype of ``config.json`` (``dtype`` or ``torch_dtype``) when SGLang serves it as is, else ``auto``."""
    path = Path(model_dir) / "config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    dtype = str(config.get("dtype") or config.get("torch_dtype") or "auto").removeprefix("torch.")
    return dtype if dtype in SERVED_DTYPES else "auto"


def detect_device() -> str:
    """``cuda`` when torch sees a GPU, else ``cpu``."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def given_native(config: Config) -> dict[str, Any]:
    """``{ServerArgs field: value}`` of the ``--sglang-<field>`` options given in ``config``."""
    return given_values(config.option, native_fields())


def server_fields(config: Config, model_dir: str, ordinal: int, device: str | None = None) -> tuple[dict, dict]:
    """``(values, texts)`` for server number ``ordinal`` of this process (see
    :mod:`plasmid_sglang.launch`): the given ``--sglang-*`` options, plasmid's defaults for the rest.
    The port is left out (:class:`ServerProcess` picks one at each start)."""
    given = given_native(config)
    kinds = {f.name: f.kind for f in native_fields()}
    device = str(given.get("device") or device or detect_device())
    cpu = device == "cpu"
    colocated_gpu = ScheduleOptions.of(config).placement == "colocate" and not cpu
    defaults: dict[str, Any] = {
        "host": "127.0.0.1",
        "random_seed": GeneralOptions.of(config).seed + ordinal,
        "device": device,
        "dtype": checkpoint_dtype(model_dir),
        "skip_tokenizer_init": True,
        "weight_version": "0",
    }
    if cpu:
        defaults.update(attention_backend="torch_native", sampling_backend="pytorch", sleep_on_idle=True,
                        max_total_tokens=CPU_MAX_TOTAL_TOKENS)
    if colocated_gpu:
        defaults.update(enable_memory_saver=True, enable_weights_cpu_backup=True)
    values = {**defaults, **{k: v for k, v in given.items() if kinds[k] != "text"}, "model_path": str(model_dir)}
    texts = {k: str(v) for k, v in given.items() if kinds[k] == "text"}
    for name in texts:
        values.pop(name, None)
    values.pop("port", None)
    return values, texts


@dataclass
class ServerProcess:
    """One launched SGLang server.

    :ivar values: / :ivar texts: its settings (:func:`server_fields`), without the port.
    :ivar env: environment entries added to this process's for the server.
    :ivar log_path: where its output goes (appended to across restarts).
    """

    values: dict[str, Any]
    texts: dict[str, str]
    env: dict[str, str]
    log_path: Path
    fixed_port: int | None = None
    port: int = 0
    process: subprocess.Popen | None = None
    starts: int = 0
    spec_path: Path | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://{_client_host(self.values.get('host', '127.0.0.1'))}:{self.port}"

    @property
    def device(self) -> str:
        return str(self.values.get("device", "cpu"))

    def start(self) -> None:
        """Start the server process (a new port unless ``--sglang-port`` fixed one); returns at once."""
        self.port = self.fixed_port or free_port()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.spec_path = self.log_path.with_suffix(".spec.json")
        self.spec_path.write_text(json.dumps({"values": {**self.values, "port": self.port}, "texts": self.texts},
                                             indent=1, default=str))
        env = {**os.environ, **self.env}
        if self.device == "cpu":
            env.setdefault("SGLANG_USE_CPU_ENGINE", "1")
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(f"\n==== plasmid-sglang: start {self.starts} on port {self.port} ====\n".encode())
            log.flush()
            self.process = subprocess.Popen([sys.executable, "-m", "plasmid_sglang.launch", str(self.spec_path)],
                                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=env, start_new_session=True)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_healthy(self, timeout: float) -> None:
        """Block until ``/health_generate`` answers 200.

        :raises ProviderError: the process exited, or was not healthy within ``timeout`` seconds;
            the message holds the end of its log.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                code = self.process.returncode if self.process is not None else None
                raise ProviderError(f"SGLang server (port {self.port}) exited with code {code} while starting: "
                                    f"{self.log_error()}\nThe end of {self.log_path}:\n{self.log_tail()}",
                                    provider="sglang", plugin="plasmid-sglang")
            try:
                status, _ = request_blocking(self.url, "/health_generate", method="GET", timeout=30)
                if status == 200:
                    return
            except ServerUnreachable:
                pass
            time.sleep(1.0)
        self.stop()
        raise ProviderError(f"SGLang server (port {self.port}) was not healthy after {timeout:.0f} s "
                            f"(raise --sglang-startup-timeout); the end of {self.log_path}:\n{self.log_tail()}",
                            provider="sglang", plugin="plasmid-sglang")

    def terminate(self) -> None:
        """Ask the server to exit (SIGTERM to its launcher, which stops SGLang's own processes)
        without waiting; :meth:`stop` waits. Signalling the whole group instead makes SGLang take
        its scheduler's death for a crash and wait for crash diagnostics."""
        if self.process is not None and self.process.poll() is None:
            try:
                os.kill(self.process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def stop(self, grace: float = 15.0) -> None:
        """Stop the server: SIGTERM, up to ``grace`` seconds for it to exit (SGLang takes about
        five), then SIGKILL to whatever is left of its process group."""
        if self.process is None:
            return
        self.terminate()
        try:
            self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        _kill_group_quietly(self.process.pid)
        try:
            self.process.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            pass
        self.process = None

    def kill(self) -> None:
        """SIGKILL the whole process group now (what a crash looks like; tests use it)."""
        if self.process is not None:
            _kill_group_quietly(self.process.pid)
            self.process.wait(timeout=10)

    def log_error(self) -> str:
        """The last ``SomeError: message`` line of the log (the cause of a failed start), or ``""``."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        causes = [line.strip() for line in text if re.match(r"^\s*[\w.]*(Error|Exception): ", line)]
        return causes[-1] if causes else "(no error line in the log)"

    def log_tail(self, lines: int = 25) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        useful = [line for line in text if "Ignore import error" not in line]
        return "\n".join(useful[-lines:])


def _kill_group_quietly(group: int) -> None:
    try:
        os.killpg(group, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _client_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "", None) else host
