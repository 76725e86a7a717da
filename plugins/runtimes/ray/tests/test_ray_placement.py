"""Placement: bundles sized from --trainer-workers, --engines and the per-actor resources,
colocated or disaggregated, ordered by (node IP, GPU id) so rank -> device is reproducible."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")

import plasmid_ray.plugin  # noqa: E402
from plasmid_ray.placement import (  # noqa: E402
    BundleInfo,
    Resources,
    actor_resources,
    bundle_plan,
    place,
)

from plasmid import testing  # noqa: E402


def option(**values):
    """A run's configuration: 2 trainer workers of 2 CPUs, 3 engines of 1, colocated, unless ``values`` say."""
    defaults = {"trainer_workers": 2, "engines": 3, "placement": "colocate", "ray_cpus_per_engine": 1.0,
                "ray_cpus_per_trainer": 2.0, "ray_placement_timeout": 30.0}
    return testing.make_config(plasmid_ray.plugin, **{**defaults, **values})


def test_colocated_trainer_and_engine_of_a_rank_share_a_bundle():
    trainer, engine = actor_resources(option(), cluster_gpus=0)
    bundles, trainers, engines = bundle_plan(option(), trainer, engine)
    assert bundles == [{"CPU": 3.0}, {"CPU": 3.0}, {"CPU": 1.0}]
    assert trainers == [0, 1] and engines == [0, 1, 2]


def test_disaggregated_pools_have_their_own_bundles():
    opt = option(placement="disaggregate")
    trainer, engine = actor_resources(opt, cluster_gpus=0)
    bundles, trainers, engines = bundle_plan(opt, trainer, engine)
    assert bundles == [{"CPU": 2.0}] * 2 + [{"CPU": 1.0}] * 3
    assert trainers == [0, 1] and engines == [2, 3, 4]


def test_gpus_default_to_one_per_actor_and_colocated_actors_split_one():
    trainer, engine = actor_resources(option(placement="disaggregate"), cluster_gpus=8)
    assert (trainer.gpus, engine.gpus) == (1.0, 1.0)
    trainer, engine = actor_resources(option(), cluster_gpus=8)
    assert (trainer.gpus, engine.gpus) == (0.5, 0.5)
    bundles, _, _ = bundle_plan(option(), trainer, engine)
    assert bundles[0] == {"CPU": 3.0, "GPU": 1.0} and bundles[2] == {"CPU": 1.0, "GPU": 0.5}
    assert actor_resources(option(ray_gpus_per_engine=0.0), cluster_gpus=8)[1] == Resources(1.0, 0.0)


def test_bundles_sort_by_node_ip_numerically_then_gpu_id():
    found = [BundleInfo(0, "10.0.0.10", (0,)), BundleInfo(1, "10.0.0.2", (1,)), BundleInfo(2, "10.0.0.2", (0,)),
             BundleInfo(3, "10.0.0.9", ())]
    assert [b.index for b in sorted(found, key=BundleInfo.sort_key)] == [2, 1, 3, 0]


@pytest.mark.parametrize("mode", ["colocate", "disaggregate"])
def test_a_placement_group_is_reserved_probed_and_mapped(ray_cluster, mode):
    opt = option(placement=mode, trainer_workers=2, engines=2, ray_cpus_per_trainer=1.0, ray_cpus_per_engine=1.0)
    placement = place(opt, cluster_gpus=0)
    try:
        node = ray.util.get_node_ip_address()
        assert all(info.node_ip == node and info.gpu_ids == () for info in placement.bundles)
        if mode == "colocate":
            assert len(placement.bundles) == 2 and placement.trainer_bundles == placement.engine_bundles == [0, 1]
        else:
            assert len(placement.bundles) == 4
            assert placement.trainer_bundles == [0, 1] and placement.engine_bundles == [2, 3]
        assert "trainer 1 -> bundle 1" in placement.describe()
    finally:
        ray.util.remove_placement_group(placement.group)


def test_an_unsatisfiable_placement_names_what_it_needed(ray_cluster):
    from plasmid.errors import UsageError

    opt = option(placement="disaggregate", engines=8, ray_cpus_per_engine=1.0, ray_placement_timeout=2.0)
    with pytest.raises(UsageError, match=r"could not reserve 10 bundles .* lower --engines/--trainer-workers"):
        place(opt, cluster_gpus=0)
