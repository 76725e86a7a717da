"""plasmid's own options of the ``sglang`` engine and its syncs (``--sglang-servers``, the
health monitor, the router, ...). SGLang's ``ServerArgs`` fields are not here: they pass through
as generated ``--sglang-<field>`` options (:mod:`plasmid_sglang.native`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from plasmid.errors import UsageError
from plasmid.options import Options, option


class SGLangOptions(Options, group="sglang", description="SGLang servers as the rollout engine (--engine sglang)"):
    sglang_external_addrs: str | None = option(
        None, "attach to these running SGLang servers instead of launching any (one engine fronts them all and "
        "balances requests; use --engines 1)", metavar="HOST:PORT,...")
    sglang_servers: int = option(1, "servers each engine launches on --model; requests go to the least loaded", min=1)
    sglang_server_env: tuple[str, ...] = option(
        (), "environment variable for launched servers, repeatable (CUDA_VISIBLE_DEVICES=1, ...)", metavar="KEY=VALUE")
    sglang_log_dir: Path | None = option(None, "server logs", default_text="<run dir>/sglang")
    sglang_startup_timeout: float = option(900.0, "seconds a launched server may take to become healthy", gt=0)
    sglang_max_concurrency: int = option(512, "requests in flight per server; more wait in this process", min=1)
    sglang_request_timeout: float = option(3600.0, "seconds one /generate request may take", gt=0)
    sglang_request_retries: int = option(3, "times a request is sent again after its server stopped answering",
                                         min=0)
    sglang_flush_timeout: float = option(60.0, "seconds flush_cache retries while requests still run before it "
                                         "fails", gt=0)
    sglang_health_interval: float = option(10.0, "seconds between health checks of each server; 0 turns the "
                                           "monitor off", min=0)
    sglang_max_restarts: int = option(3, "restarts of a dead launched server before it is out of service; 0 also "
                                      "keeps no copy of the weights for restoring", min=0)
    sglang_tensor_transport: Literal["auto", "pickle", "cuda-ipc"] = option(
        "auto", "how tensor updates reach servers: the bytes in the request (pickle), or CUDA IPC handles for a "
        "server on the same GPU host (auto: cuda-ipc for GPU tensors)")
    sglang_update_backend: Literal["auto", "gloo", "nccl"] = option(
        "auto", "torch.distributed backend of --weight-sync sglang-distributed (auto: nccl when the trainer sees a "
        "GPU, else gloo)")
    sglang_router: bool = option(False, "front the servers with an SGLang router (package sglang-router); without "
                                 "it the engine sends each request to its least loaded server")
    sglang_router_policy: Literal["cache_aware", "round_robin", "random", "power_of_two"] = option(
        "cache_aware", "the router's policy (cache_aware: a shared prefix goes where it is cached)")
    sglang_router_arg: tuple[str, ...] = option(
        (), "extra argument for sglang_router.launch_router, repeatable (--sglang-router-arg=--queue-size=256)",
        metavar="ARG")
    sglang_update_timeout: float = option(600.0, "seconds the distributed weight-update group waits for its "
                                          "members", gt=0)

    def check(self) -> None:
        parse_env(self.sglang_server_env)

    @property
    def external_addresses(self) -> list[str]:
        """``--sglang-external-addrs`` split at commas (empty: launch servers)."""
        return [address.strip() for address in (self.sglang_external_addrs or "").split(",") if address.strip()]

    @property
    def server_env(self) -> dict[str, str]:
        """``--sglang-server-env`` as a dict."""
        return parse_env(self.sglang_server_env)

    def log_dir(self, run_dir: str | Path) -> Path:
        """``--sglang-log-dir``, or ``<run_dir>/sglang``."""
        return self.sglang_log_dir if self.sglang_log_dir is not None else Path(run_dir) / "sglang"


def parse_env(entries: tuple[str, ...] | list[str]) -> dict[str, str]:
    """``KEY=VALUE`` entries of ``--sglang-server-env`` as a dict."""
    env = {}
    for entry in entries:
        key, sep, value = entry.partition("=")
        if not sep or not key:
            raise UsageError(f"--sglang-server-env {entry!r}: expected KEY=VALUE")
        env[key] = value
    return env
