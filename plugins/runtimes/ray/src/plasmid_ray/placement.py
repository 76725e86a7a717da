"""One placement group per run, its bundles ordered deterministically, and rank -> bundle.

Bundles (one per actor slot, ``PACK`` strategy):

- ``--placement colocate``: ``max(--trainer-workers, --engines)`` bundles; trainer rank ``i``
  and engine ``i`` share bundle ``i`` (CPUs add up; with GPUs both actors take half of the
  bundle's GPU, so they land on the same device and the engine releases memory while training).
- ``--placement disaggregate``: ``--trainer-workers`` trainer bundles then ``--engines`` engine
  bundles, separate pools.

Ray numbers bundles in creation order, not by where they landed. As slime does, a tiny probe actor
runs in each bundle and reports its node IP and GPU ids; bundles are sorted by (node IP, GPU id,
bundle index), and rank ``r`` gets the ``r``-th bundle of its role, so the rank -> device
mapping is the same on every run of the same cluster.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

from plasmid.config import Config
from plasmid.errors import UsageError
from plasmid.kernel_options import ScheduleOptions
from plasmid_ray.options import RayOptions


@dataclass(frozen=True)
class Resources:
    """What one actor reserves inside its bundle."""

    cpus: float
    gpus: float = 0.0

    def as_options(self) -> dict[str, float]:
        return {"num_cpus": self.cpus, "num_gpus": self.gpus}


@dataclass(frozen=True)
class BundleInfo:
    """Where a bundle landed, as its probe saw it."""

    index: int
    node_ip: str
    gpu_ids: tuple[int, ...] = ()

    def sort_key(self) -> tuple:
        try:
            ip: tuple = (0, int(ipaddress.ip_address(self.node_ip)))
        except ValueError:
            ip = (1, self.node_ip)
        return (ip, self.gpu_ids[0] if self.gpu_ids else -1, self.index)


@dataclass
class Placement:
    """The run's placement group and which bundle each trainer rank and engine uses.

    ``group`` is ``None`` when actors are scheduled without a placement group (tests that build
    single actors); then every ``*_bundles`` entry is ``None``.
    """

    group: Any
    trainer_bundles: list[int | None]
    engine_bundles: list[int | None]
    trainer: Resources
    engine: Resources
    bundles: list[BundleInfo] = field(default_factory=list)

    @classmethod
    def unplaced(cls, trainers: int, engines: int, trainer: Resources, engine: Resources) -> Placement:
        return cls(None, [None] * trainers, [None] * engines, trainer, engine)

    def scheduling(self, bundle: int | None) -> dict[str, Any]:
        """Actor options that pin it to ``bundle`` (nothing when unplaced)."""
        if self.group is None or bundle is None:
            return {}
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return {"scheduling_strategy": PlacementGroupSchedulingStrategy(
            placement_group=self.group, placement_group_bundle_index=bundle,
            placement_group_capture_child_tasks=True)}

    def describe(self) -> str:
        where = {b.index: f"{b.node_ip}" + (f" gpu {','.join(map(str, b.gpu_ids))}" if b.gpu_ids else "")
                 for b in self.bundles}
        trainers = ", ".join(f"trainer {r} -> bundle {b} ({where.get(b, '?')})" for r, b in
                             enumerate(self.trainer_bundles))
        engines = ", ".join(f"engine {r} -> bundle {b} ({where.get(b, '?')})" for r, b in
                            enumerate(self.engine_bundles))
        return f"{trainers}; {engines}"


def actor_resources(config: Config, cluster_gpus: float) -> tuple[Resources, Resources]:
    """``(trainer worker, engine)`` reservations from the ``--ray-*`` options; GPUs default to
    1 each when the cluster has any. Colocated actors on GPUs take half a GPU each."""
    ray_options = RayOptions.of(config)
    default_gpus = 1.0 if cluster_gpus > 0 else 0.0
    trainer_gpus = ray_options.ray_gpus_per_trainer
    engine_gpus = ray_options.ray_gpus_per_engine
    trainer_gpus = default_gpus if trainer_gpus is None else trainer_gpus
    engine_gpus = default_gpus if engine_gpus is None else engine_gpus
    if ScheduleOptions.of(config).placement == "colocate" and trainer_gpus > 0 and engine_gpus > 0:
        shared = max(trainer_gpus, engine_gpus) / 2
        trainer_gpus = engine_gpus = shared
    return (Resources(ray_options.ray_cpus_per_trainer, trainer_gpus),
            Resources(ray_options.ray_cpus_per_engine, engine_gpus))


def bundle_plan(config: Config, trainer: Resources,
                engine: Resources) -> tuple[list[dict[str, float]], list[int], list[int]]:
    """``(bundles, trainer bundle indexes, engine bundle indexes)`` before ordering."""
    schedule = ScheduleOptions.of(config)
    trainers, engines = schedule.trainer_workers, schedule.engines
    bundles: list[dict[str, float]] = []
    if schedule.placement == "colocate":
        for slot in range(max(trainers, engines)):
            members = ([trainer] if slot < trainers else []) + ([engine] if slot < engines else [])
            bundles.append(_bundle(members))
        return bundles, list(range(trainers)), list(range(engines))
    bundles = [_bundle([trainer]) for _ in range(trainers)] + [_bundle([engine]) for _ in range(engines)]
    return bundles, list(range(trainers)), list(range(trainers, trainers + engines))


def total_cpus(config: Config, trainer: Resources, engine: Resources) -> float:
    """Logical CPUs that every bundle of the run's placement group reserves together."""
    bundles, _, _ = bundle_plan(config, trainer, engine)
    return sum(b["CPU"] for b in bundles)


def place(config: Config, cluster_gpus: float) -> Placement:
    """Reserve the placement group, probe and order its bundles, map ranks to bundles."""
    import ray
    from ray.util.placement_group import placement_group

    trainer, engine = actor_resources(config, cluster_gpus)
    bundles, trainer_slots, engine_slots = bundle_plan(config, trainer, engine)
    group = placement_group(bundles, strategy="PACK")
    timeout = RayOptions.of(config).ray_placement_timeout
    ready, _ = ray.wait([group.ready()], timeout=timeout)
    if not ready:
        ray.util.remove_placement_group(group)
        raise UsageError(
            f"plasmid-ray: the cluster could not reserve {len(bundles)} bundles {bundles} within {timeout:.0f} s "
            f"(cluster has {ray.cluster_resources()}); lower --engines/--trainer-workers or --ray-cpus-per-*/"
            f"--ray-gpus-per-*, or give a local cluster more CPUs with --ray-num-cpus")
    infos = probe_bundles(group, bundles)
    by_index = {info.index: info for info in infos}
    order = {info.index: rank for rank, info in enumerate(sorted(infos, key=BundleInfo.sort_key))}
    if ScheduleOptions.of(config).placement == "colocate":
        ordered = sorted(range(len(bundles)), key=order.__getitem__)
        trainer_bundles = ordered[: len(trainer_slots)]
        engine_bundles = ordered[: len(engine_slots)]
    else:
        trainer_bundles = sorted(trainer_slots, key=order.__getitem__)
        engine_bundles = sorted(engine_slots, key=order.__getitem__)
    landed = [by_index[index] for index in range(len(bundles))]
    return Placement(group, trainer_bundles, engine_bundles, trainer, engine, landed)


def probe_bundles(group: Any, bundles: list[dict[str, float]]) -> list[BundleInfo]:
    """Start a tiny actor in every bundle, ask where it landed, and end it."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    probe_class = ray.remote(BundleProbe)
    probes = []
    for index, bundle in enumerate(bundles):
        strategy = PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=index)
        gpus = 0.01 if bundle.get("GPU", 0) > 0 else 0
        probes.append(probe_class.options(num_cpus=0.01, num_gpus=gpus, scheduling_strategy=strategy).remote())
    try:
        return [BundleInfo(index, *found) for index, found in enumerate(ray.get([p.where.remote() for p in probes]))]
    finally:
        for probe in probes:
            ray.kill(probe, no_restart=True)


class BundleProbe:
    """The probe actor: reports its node IP and visible GPU ids."""

    def where(self) -> tuple[str, tuple[int, ...]]:
        import ray

        return ray.util.get_node_ip_address(), tuple(sorted(int(g) for g in ray.get_gpu_ids()))


def _bundle(members: list[Resources]) -> dict[str, float]:
    bundle = {"CPU": sum(m.cpus for m in members)}
    gpus = max((m.gpus for m in members), default=0.0)
    if len(members) > 1 and gpus > 0:
        gpus = min(1.0, sum(m.gpus for m in members))
    if gpus > 0:
        bundle["GPU"] = gpus
    return bundle
