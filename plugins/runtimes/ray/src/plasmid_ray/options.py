"""The options of the ``ray`` runtime: which cluster, and what each actor reserves in it."""

from __future__ import annotations

from typing import Literal

from plasmid.options import Options, option


class RayOptions(Options, group="ray", description="the Ray runtime (--runtime ray)"):
    ray_address: str | None = option(None, "Ray cluster to attach to",
                                     default_text="$RAY_ADDRESS, else start a local cluster")
    ray_host: str = option("127.0.0.1", "address the processes of a local Ray cluster started by plasmid listen on: "
                           "127.0.0.1 (this machine only) or this node's IP (Ray then listens on every "
                           "interface, so other machines can reach it)")
    ray_num_cpus: float | None = option(None, "logical CPUs of a local cluster started by plasmid", gt=0,
                                        default_text="what the actors need, at least the machine's CPU count")
    ray_cpus_per_engine: float = option(1.0, "CPUs reserved per engine actor", gt=0)
    ray_cpus_per_trainer: float = option(1.0, "CPUs reserved per trainer worker", gt=0)
    ray_gpus_per_engine: float | None = option(None, "GPUs per engine actor", min=0,
                                               default_text="1 when the cluster has GPUs, else 0")
    ray_gpus_per_trainer: float | None = option(None, "GPUs per trainer worker", min=0,
                                                default_text="1 when the cluster has GPUs, else 0")
    ray_engine_restarts: int = option(3, "how many times a dead engine actor is restarted (weights re-synced, "
                                      "requests retried) before the run fails", min=0)
    ray_placement_timeout: float = option(120.0, "seconds to wait for the placement group's resources", gt=0)
    ray_step_snapshot: Literal["auto", "on", "off"] = option(
        "auto", "after each train step, hold a copy of the trainer's state in Ray's object store (one trainer save "
        "a step), so that a trainer worker's death still checkpoints the last finished step: on, off, or auto (on "
        "while a snapshot is at most 2 GiB and it takes at most 10% of a step)")
