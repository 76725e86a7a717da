"""Every actor loads exactly the driver's plugin lock before it does any work: an actor whose
installed plugin versions differ from the driver's fails to start, naming the package."""

from __future__ import annotations

import asyncio

import pytest

ray = pytest.importorskip("ray")

import plasmid_grpo.plugin  # noqa: E402
import plasmid_torchgen.plugin  # noqa: E402
import plasmid_torchtrain.plugin  # noqa: E402
from plasmid_ray.engines import EnginePool  # noqa: E402
from plasmid_ray.placement import Placement, Resources  # noqa: E402
from plasmid_ray.trainer import start_trainers  # noqa: E402

from plasmid import testing  # noqa: E402
from plasmid.errors import PluginError  # noqa: E402
from plasmid_torch.tiny import build_tiny_model  # noqa: E402


def config_with_lock(tmp_path, lock):
    model = build_tiny_model(tmp_path / "tiny")
    config = testing.make_config(plasmid_grpo.plugin, plasmid_torchtrain.plugin, plasmid_torchgen.plugin,
                                 model=str(model), run_dir=tmp_path / "run")
    config.plugin_lock = lock
    return config


def drifted(lock, name, version):
    """``lock`` as a driver with another version of plugin ``name`` would send it."""
    assert any(entry["name"] == name for entry in lock), f"{name} is not installed"
    return [dict(entry, version=version) if entry["name"] == name else entry for entry in lock]


UNPLACED = Placement.unplaced(1, 1, Resources(0.5), Resources(0.5))


def test_an_engine_actor_with_another_plugin_version_fails_naming_the_package(ray_cluster, installed_lock, tmp_path):
    config = config_with_lock(tmp_path, drifted(installed_lock, "torchgen", "9.9.9"))
    with pytest.raises(PluginError) as failure:
        asyncio.run(EnginePool(config, UNPLACED).start())
    message = str(failure.value)
    assert message.startswith("engine 0 failed to start")
    assert "the driver has plasmid-torchgen 9.9.9 but this process has plasmid-torchgen 0.1.0" in message
    assert "pip install plasmid-torchgen==9.9.9" in message


def test_a_trainer_worker_with_another_plugin_version_fails_naming_the_package(ray_cluster, installed_lock,
                                                                              tmp_path):
    config = config_with_lock(tmp_path, drifted(installed_lock, "grpo", "0.0.1"))
    with pytest.raises(PluginError, match=r"trainer worker 0 failed to start: .*the driver has plasmid-grpo 0\.0\.1 "
                                          r"but this process has plasmid-grpo 0\.1\.0"):
        asyncio.run(start_trainers(config, UNPLACED))


def test_an_actor_missing_a_plugin_of_the_lock_fails_naming_it(ray_cluster, installed_lock, tmp_path):
    lock = [*installed_lock, {"name": "xyz", "distribution": "rl-plugin-xyz", "version": "1.0", "target": "x"}]
    config = config_with_lock(tmp_path, lock)
    with pytest.raises(PluginError, match=r"plugin 'xyz' \(rl-plugin-xyz 1\.0\) is in the plugin lock but not "
                                          r"installed in this process"):
        asyncio.run(EnginePool(config, UNPLACED).start())


def test_no_actor_is_left_holding_resources_after_a_failed_start(ray_cluster):
    import time

    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU", 0) < ray.cluster_resources()["CPU"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0) == ray.cluster_resources()["CPU"]
