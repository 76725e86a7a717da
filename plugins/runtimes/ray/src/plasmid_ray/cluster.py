"""Attaching to a Ray cluster, or starting a local one, for one run.

Order of precedence: a Ray session this process already started (``ray.init`` by the caller, as
tests do: the runtime then uses it and leaves it running), ``--ray-address``, ``$RAY_ADDRESS``,
else a new local cluster with ``--ray-num-cpus`` logical CPUs (default: enough for the actors).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from plasmid.config import Config
from plasmid_ray.options import RayOptions

#: Environment of every actor process: one math thread unless an actor sets more, no hub access.
ACTOR_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
             "HF_HUB_OFFLINE": "1"}
#: Environment plasmid sets (when unset) before it starts a local cluster itself.
LOCAL_CLUSTER_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}


@dataclass
class Connection:
    """How this run reached Ray; ``started`` means plasmid owns the session and shuts it down."""

    address: str
    started: bool
    gpus: float


def connect(config: Config, cpus_needed: float) -> Connection:
    """Attach or start Ray (see the module docstring); returns what was done."""
    import ray

    if ray.is_initialized():
        return Connection("(this process)", False, float(ray.cluster_resources().get("GPU", 0)))
    options = RayOptions.of(config)
    address = options.ray_address if options.ray_address is not None else os.environ.get("RAY_ADDRESS")
    runtime_env = {"env_vars": dict(ACTOR_ENV)}
    if address:
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=True)
        return Connection(address, True, float(ray.cluster_resources().get("GPU", 0)))
    for name, value in LOCAL_CLUSTER_ENV.items():
        os.environ.setdefault(name, value)
    cpus = options.ray_num_cpus if options.ray_num_cpus is not None else max(float(os.cpu_count() or 1), cpus_needed)
    ray.init(num_cpus=cpus, include_dashboard=False, runtime_env=runtime_env, log_to_driver=True)
    return Connection("local", True, float(ray.cluster_resources().get("GPU", 0)))


def disconnect(connection: Connection) -> None:
    import ray

    if connection.started and ray.is_initialized():
        ray.shutdown()


def node_address() -> str:
    """This process's node IP as Ray sees it (127.0.0.1 outside Ray)."""
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - outside a Ray worker there is no node address
        return "127.0.0.1"


def free_port() -> int:
    """A TCP port that is free on this node now."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])
