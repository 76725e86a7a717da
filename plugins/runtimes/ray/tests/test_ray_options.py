"""plasmid-ray's options are declared once, typed (no Ray cluster needed): a bad value fails at
configuration time in one line naming the flag, and an unset option reads its declared default."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")

import plasmid_ray.plugin
from plasmid_ray.actors import is_collective
from plasmid_ray.options import RayOptions
from plasmid_ray.placement import Resources, actor_resources

from plasmid import testing
from plasmid.errors import UsageError


@pytest.mark.parametrize(("name", "value", "message"), [
    ("ray_cpus_per_engine", 0.0, "--ray-cpus-per-engine 0.0: must be > 0"),
    ("ray_cpus_per_trainer", -1.0, "--ray-cpus-per-trainer -1.0: must be > 0"),
    ("ray_gpus_per_engine", -0.5, "--ray-gpus-per-engine -0.5: must be >= 0"),
    ("ray_gpus_per_trainer", -1.0, "--ray-gpus-per-trainer -1.0: must be >= 0"),
    ("ray_engine_restarts", -1, "--ray-engine-restarts -1: must be >= 0"),
    ("ray_placement_timeout", 0.0, "--ray-placement-timeout 0.0: must be > 0"),
    ("ray_num_cpus", 0.0, "--ray-num-cpus 0.0: must be > 0"),
    ("ray_engine_restarts", "twice", "--ray-engine-restarts: expected int, got 'twice'"),
    ("ray_step_snapshot", "sometimes", "--ray-step-snapshot 'sometimes': choose one of auto, on, off"),
])
def test_a_bad_value_is_a_one_line_usage_error_naming_the_flag(name, value, message):
    with pytest.raises(UsageError) as failure:
        testing.make_config(plasmid_ray.plugin, **{name: value})
    assert str(failure.value) == message


def test_typed_reads_give_the_declared_defaults():
    options = RayOptions.of(testing.make_config(plasmid_ray.plugin))
    assert options == RayOptions(ray_address=None, ray_host="127.0.0.1", ray_num_cpus=None, ray_cpus_per_engine=1.0,
                                 ray_cpus_per_trainer=1.0, ray_gpus_per_engine=None, ray_gpus_per_trainer=None,
                                 ray_engine_restarts=3, ray_placement_timeout=120.0,
                                 ray_step_snapshot="auto")
    trainer, engine = actor_resources(testing.make_config(plasmid_ray.plugin), cluster_gpus=0)
    assert trainer == engine == Resources(1.0, 0.0), "one CPU each, no GPU on a cluster without GPUs"


def test_a_trainer_is_collective_only_when_its_class_says_so():
    class RankZeroReads:
        pass

    class Sharded:
        collective = True

    class SaysSoOnlyOnOneInstance:
        def __init__(self) -> None:
            self.collective = True

    assert not is_collective(RankZeroReads()) and is_collective(Sharded())
    assert not is_collective(SaysSoOnlyOnOneInstance()), "a property of the trainer's class, not of one object"
