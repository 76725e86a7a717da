"""Attaching to a Ray cluster, or starting a local one, for one run.

Order of precedence: a Ray session this process already started (``ray.init`` by the caller, as
tests do: the runtime then uses it and leaves it running), ``--ray-address``, ``$RAY_ADDRESS``,
else a new local cluster with ``--ray-num-cpus`` logical CPUs (default: enough for the actors).

A local cluster plasmid starts listens on ``--ray-host`` only, 127.0.0.1 by default: its node IP
is then the loopback address, so the GCS, the raylet, the workers' gRPC servers and the runtime-env
agent bind to 127.0.0.1, the dashboard stays off, and the trainers' process group uses a file
store and the loopback interface (``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME=lo``, unless set).
(Ray resolves an explicit ``_node_ip_address="127.0.0.1"`` to the machine's IP; its node IP stays
the loopback one only with ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, which on Linux changes
nothing else.) Another ``--ray-host`` (this node's IP) makes it the node IP; Ray 2.60 then listens
on every interface. Every process of that cluster ends with the driver (:mod:`.reaper`).
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field

from plasmid.config import Config
from plasmid.errors import UsageError
from plasmid_ray.options import RayOptions
from plasmid_ray.reaper import Reaper, start_reaper

#: Environment of every actor process: one math thread unless an actor sets more, no hub access.
ACTOR_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
             "HF_HUB_OFFLINE": "1"}
#: Environment plasmid sets (when unset) before it starts a local cluster itself.
LOCAL_CLUSTER_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
#: Environment of the actors of a local cluster bound to the loopback address (when unset): the
#: trainers' process group and weight-sync groups then use the loopback interface.
LOOPBACK_ACTOR_ENV = {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}


@dataclass
class Connection:
    """How this run reached Ray; ``started`` means plasmid owns the session and shuts it down."""

    address: str
    started: bool
    gpus: float
    #: the reaper of a local cluster plasmid started (None otherwise)
    reaper: Reaper | None = field(default=None, repr=False)


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
    host, init_args = options.ray_host, {}
    if is_loopback(host):
        keep_loopback_node_ip()
        runtime_env["env_vars"].update({k: v for k, v in LOOPBACK_ACTOR_ENV.items() if k not in os.environ})
    else:
        init_args["_node_ip_address"] = host
    reaper = start_reaper()
    try:
        ray.init(num_cpus=cpus, include_dashboard=False, dashboard_host="127.0.0.1", runtime_env=runtime_env,
                 log_to_driver=True, **init_args)
        node_ip = ray.util.get_node_ip_address()
        if is_loopback(host) and not is_loopback(node_ip):
            raise UsageError(f"--ray-host {host}: Ray chose node IP {node_ip} (set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 "
                             f"before Ray is imported, or give --ray-host {node_ip})")
    except BaseException:
        if ray.is_initialized():
            ray.shutdown()
        reaper.release()
        raise
    return Connection(f"local ({node_ip})", True, float(ray.cluster_resources().get("GPU", 0)), reaper)


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback interface."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def keep_loopback_node_ip() -> None:
    """Make a local cluster started from this process take 127.0.0.1 as its node IP (see the
    module docstring): for the processes it starts (environment) and for this one."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


def disconnect(connection: Connection) -> None:
    """Stop Ray if this run started or attached it; a local cluster's reaper then sweeps what
    is left of it."""
    import ray

    if connection.started and ray.is_initialized():
        ray.shutdown()
    if connection.reaper is not None:
        connection.reaper.release()


def node_address() -> str:
    """This process's node IP as Ray sees it (127.0.0.1 outside Ray)."""
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - outside a Ray worker there is no node address
        return "127.0.0.1"


def free_port(host: str = "") -> int:
    """A TCP port that is free on this node now (on ``host``; every interface by default)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])
