"""plasmid's own options of the ``vllm`` engine (``--vllm-external-addrs``, timeouts, the health
monitor, ...). vLLM's engine arguments are not here: they pass through as generated
``--vllm-<field>`` options (:mod:`plasmid_vllm.native`)."""

from __future__ import annotations

from pathlib import Path

from plasmid.options import Options, option
from plasmid_serving.options import ServingOptions


class VLLMOptions(ServingOptions, Options, group="vllm",
                  description="vLLM servers as the rollout engine (--engine vllm)"):
    """The ``vllm_*`` settings :class:`plasmid_serving.options.ServingOptions` reads are declared here."""

    prefix = "vllm"

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
