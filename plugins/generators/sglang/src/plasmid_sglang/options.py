"""plasmid's own options of the ``sglang`` engine and its syncs (``--sglang-servers``, the
health monitor, the router, ...). SGLang's ``ServerArgs`` fields are not here: they pass through
as generated ``--sglang-<field>`` options (:mod:`plasmid_sglang.native`)."""

from __future__ import annotations

from typing import Literal

from plasmid.options import Options, option
from plasmid_serving.options import ServingOptions


class SGLangOptions(ServingOptions, Options, group="sglang",
                    description="SGLang servers as the rollout engine (--engine sglang)"):
    """The ``sglang_*`` settings :class:`plasmid_serving.options.ServingOptions` reads are declared by it
    (``--sglang-external-addrs`` ... ``--sglang-max-restarts``); the others are this engine's own."""

    prefix = "sglang"

    serving_help = {
        "external_addrs": "attach to these running SGLang servers instead of launching any (one engine fronts them "
                          "all and balances requests; use --engines 1)",
        "request_timeout": "seconds one /generate request may take",
    }

    sglang_servers: int = option(1, "servers each engine launches on --model; requests go to the least loaded", min=1)
    sglang_flush_timeout: float = option(60.0, "seconds flush_cache retries while requests still run before it "
                                         "fails", gt=0)
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
