"""Fixtures of plasmid-ray's tests: one local Ray cluster per test module, and helpers that build
engine and trainer actors outside a full run.

The cluster: 4 logical CPUs (more than this machine's 2 cores: actors reserve logical CPUs, and
a run with 2 engines and 2 trainer workers needs 4), its session directory under a short path
in /tmp (Ray's unix sockets live there and their paths must stay under ~107 characters), and
one math thread per actor.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
CLUSTER_CPUS = 4


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster for the test module (started once; actors see OMP_NUM_THREADS=1)."""
    ray = pytest.importorskip("ray")
    from plasmid_ray.cluster import ACTOR_ENV

    saved = {name: os.environ.get(name) for name in RAY_ENV}
    os.environ.update(RAY_ENV)
    temp_dir = tempfile.mkdtemp(prefix="plasmid-ray-", dir="/tmp")
    ray.init(num_cpus=CLUSTER_CPUS, include_dashboard=False, _temp_dir=temp_dir,
             runtime_env={"env_vars": dict(ACTOR_ENV)}, log_to_driver=True)
    try:
        yield ray
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture(scope="session")
def installed_lock() -> list[dict[str, str]]:
    """The plugin lock of every installed plugin (what ``plasmid train`` sends to its actors);
    configurations built by ``plasmid.testing.make_config`` carry a lock of test entries that
    no actor could load."""
    from plasmid.plugins import PluginManager, Selection

    manager = PluginManager()
    manager.load(Selection())
    return manager.lock()
