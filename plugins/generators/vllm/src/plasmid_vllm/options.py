"""plasmid's own options of the ``vllm`` engine (``--vllm-external-addrs``, timeouts, the health
monitor, ...). vLLM's engine arguments are not here: they pass through as generated
``--vllm-<field>`` options (:mod:`plasmid_vllm.native`)."""

from __future__ import annotations

from plasmid.options import Options, option
from plasmid_serving.options import ServingOptions


class VLLMOptions(ServingOptions, Options, group="vllm",
                  description="vLLM servers as the rollout engine (--engine vllm)"):
    """The ``vllm_*`` settings :class:`plasmid_serving.options.ServingOptions` reads are declared by it
    (``--vllm-external-addrs`` ... ``--vllm-max-restarts``); ``--vllm-update-timeout`` is vLLM's own."""

    prefix = "vllm"

    serving_help = {
        "external_addrs": "attach to these running vLLM servers (started with VLLM_SERVER_DEV_MODE=1) instead of "
                          "launching one (one engine fronts them all and balances requests; use --engines 1)",
        "server_env": "environment variable for the launched server, repeatable (CUDA_VISIBLE_DEVICES=1, ...)",
        "health_interval": "seconds between health checks of each launched server; 0 turns the monitor off",
    }

    vllm_update_timeout: float = option(600.0, "seconds the NCCL weight-transfer group (--weight-sync vllm-nccl) "
                                        "waits for its members", gt=0)
