"""Hook implementations of plasmid-ray: the ``ray`` runtime and its options (Ray is imported only
when the runtime is chosen)."""

from __future__ import annotations

from plasmid import hookimpl
from plasmid.errors import UsageError


@hookimpl
def plasmid_addoption(parser):
    group = parser.getgroup("ray", "the Ray runtime (--runtime ray)")
    group.addoption("--ray-address", default=None,
                    help="Ray cluster to attach to (default: $RAY_ADDRESS, else start a local cluster)")
    group.addoption("--ray-num-cpus", type=float, default=None,
                    help="logical CPUs of a local cluster started by plasmid (default: what the actors need, "
                         "at least the machine's CPU count)")
    group.addoption("--ray-cpus-per-engine", type=float, default=1.0, help="CPUs reserved per engine actor")
    group.addoption("--ray-cpus-per-trainer", type=float, default=1.0, help="CPUs reserved per trainer worker")
    group.addoption("--ray-gpus-per-engine", type=float, default=None,
                    help="GPUs per engine actor (default: 1 when the cluster has GPUs, else 0)")
    group.addoption("--ray-gpus-per-trainer", type=float, default=None,
                    help="GPUs per trainer worker (default: 1 when the cluster has GPUs, else 0)")
    group.addoption("--ray-engine-restarts", type=int, default=3,
                    help="how many times a dead engine actor is restarted (weights re-synced, requests retried) "
                         "before the run fails")
    group.addoption("--ray-placement-timeout", type=float, default=120.0,
                    help="seconds to wait for the placement group's resources")


@hookimpl
def plasmid_configure(config):
    option = config.option
    for name in ("ray_cpus_per_engine", "ray_cpus_per_trainer"):
        if getattr(option, name, 1.0) <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be > 0 (plugin ray)")
    for name in ("ray_gpus_per_engine", "ray_gpus_per_trainer"):
        value = getattr(option, name, None)
        if value is not None and value < 0:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 0 (plugin ray)")
    if getattr(option, "ray_engine_restarts", 0) < 0:
        raise UsageError("--ray-engine-restarts must be >= 0 (plugin ray)")


@hookimpl
def plasmid_runtimes(register):
    register("ray", "plasmid_ray.runtime:RayRuntime")
