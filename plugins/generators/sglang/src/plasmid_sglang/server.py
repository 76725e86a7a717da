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
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plasmid.config import Config
from plasmid.kernel_options import GeneralOptions, RolloutOptions, ScheduleOptions
from plasmid_serving.native_options import given_values
from plasmid_serving.server_process import ManagedServer, checkpoint_dtype, detect_device, free_port, spawn
from plasmid_sglang.native import native_fields

#: KV-cache tokens of a CPU server when --sglang-max-total-tokens is not given.
CPU_MAX_TOTAL_TOKENS = 16384


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
    if RolloutOptions.of(config).return_routed_experts:     # plasmid_sglang.routing
        defaults["enable_return_routed_experts"] = True
    values = {**defaults, **{k: v for k, v in given.items() if kinds[k] != "text"}, "model_path": str(model_dir)}
    texts = {k: str(v) for k, v in given.items() if kinds[k] == "text"}
    for name in texts:
        values.pop(name, None)
    values.pop("port", None)
    return values, texts


@dataclass
class ServerProcess(ManagedServer):
    """One launched SGLang server (its lifecycle: :class:`plasmid_serving.server_process.ManagedServer`).

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

    label = "SGLang"
    provider = "sglang"
    plugin = "plasmid-sglang"
    timeout_option = "--sglang-startup-timeout"
    health_path = "/health_generate"  # SGLang generates one token to answer it
    health_timeout = 30.0
    error_pattern = r"^\s*[\w.]*(Error|Exception): "
    error_match = True
    tail_skip = "Ignore import error"

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
        self.process = spawn([sys.executable, "-m", "plasmid_sglang.launch", str(self.spec_path)], self.log_path,
                             f"==== plasmid-sglang: start {self.starts} on port {self.port} ====", env)

    def terminate(self) -> None:
        """Ask the server to exit (SIGTERM to its launcher, which stops SGLang's own processes)
        without waiting; :meth:`stop` waits. Signalling the whole group instead makes SGLang take
        its scheduler's death for a crash and wait for crash diagnostics."""
        super().terminate()


def _client_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "", None) else host
