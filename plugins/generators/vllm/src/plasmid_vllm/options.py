"""plasmid's own options of the ``vllm`` engine (``--vllm-external-addrs``, timeouts, the health
monitor, ...). vLLM's engine arguments are not here: they pass through as generated
``--vllm-<field>`` options (:mod:`plasmid_vllm.native`)."""

from __future__ import annotations

from pathlib import Path

from plasmid.errors import UsageError
from plasmid.options import Options, option


class VLLMOptions(Options, group="vllm", description="vLLM servers as the rollout engine (--engine vllm)"):
    vllm_external_addrs: str | None = option(
        None, "attach to these running vLLM servers (started with VLLM_SERVER_DEV_MODE=1) instead of launching one "
        "(one engine fronts them all and balances requests; use --engines 1)", metavar="HOST:PORT,...")
    vllm_server_env: tuple[str, ...] = option(
        (), "environment variable for the launched server, repeatable (CUDA_VISIBLE_DEVICES=1, ...)",
        metavar="KEY=VALUE")
    vllm_log_dir: Path | None = option(None, "server logs", default_text="<run dir>/vllm")
    vllm_startup_timeout: float = option(900.0, "seconds a launched server may take to become healthy", gt=0)
    vllm_max_concurrency: int = option(512, "requests in flight per server; more wait in this process", min=1)
    vllm_request_timeout: float = option(3600.0, "seconds one generate request may take", gt=0)
    vllm_request_retries: int = option(3, "times a request is sent again after its server stopped answering",
                                       min=0)
    vllm_health_interval: float = option(10.0, "seconds between health checks of each launched server; 0 turns "
                                         "the monitor off", min=0)
    vllm_max_restarts: int = option(3, "restarts of a dead launched server before it is out of service", min=0)
    vllm_update_timeout: float = option(600.0, "seconds the NCCL weight-transfer group (--weight-sync vllm-nccl) "
                                        "waits for its members", gt=0)

    def check(self) -> None:
        parse_env(self.vllm_server_env)

    @property
    def external_addresses(self) -> list[str]:
        """``--vllm-external-addrs`` split at commas (empty: launch a server)."""
        return [address.strip() for address in (self.vllm_external_addrs or "").split(",") if address.strip()]

    @property
    def server_env(self) -> dict[str, str]:
        """``--vllm-server-env`` as a dict."""
        return parse_env(self.vllm_server_env)

    def log_dir(self, run_dir: str | Path) -> Path:
        """``--vllm-log-dir``, or ``<run_dir>/vllm``."""
        return self.vllm_log_dir if self.vllm_log_dir is not None else Path(run_dir) / "vllm"


def parse_env(entries: tuple[str, ...] | list[str]) -> dict[str, str]:
    """``KEY=VALUE`` entries of ``--vllm-server-env`` as a dict."""
    env = {}
    for entry in entries:
        key, sep, value = entry.partition("=")
        if not sep or not key:
            raise UsageError(f"--vllm-server-env {entry!r}: expected KEY=VALUE")
        env[key] = value
    return env
