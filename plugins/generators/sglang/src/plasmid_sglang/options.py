"""plasmid's own options of the ``sglang`` engine and its syncs (``--sglang-servers``, the
health monitor, the router, ...). SGLang's ``ServerArgs`` fields are not here: they pass through
as generated ``--sglang-<field>`` options (:mod:`plasmid_sglang.native`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from plasmid.options import Options, option
from plasmid_serving.options import ServingOptions


class SGLangOptions(ServingOptions, Options, group="sglang",
                    description="SGLang servers as the rollout engine (--engine sglang)"):
    """The ``sglang_*`` settings :class:`plasmid_serving.options.ServingOptions` reads are declared here."""

    prefix = "sglang"

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
