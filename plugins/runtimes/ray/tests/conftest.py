"""Fixtures of plasmid-ray's tests: one local Ray cluster per test module, and helpers that build
engine and trainer actors outside a full run.

The cluster: 4 logical CPUs (more than this machine's 2 cores: actors reserve logical CPUs, and
a run with 2 engines and 2 trainer workers needs 4), its session directory under a short path
in /tmp (Ray's unix sockets live there and their paths must stay under ~107 characters), and
one math thread per actor.
"""

from __future__ import annotations

import pytest

CLUSTER_CPUS = 4


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster for the test module (started once; actors see OMP_NUM_THREADS=1)."""
    pytest.importorskip("ray")
    from plasmid_ray.testing import local_cluster

    with local_cluster(CLUSTER_CPUS) as ray:
        yield ray


@pytest.fixture(scope="session")
def installed_lock() -> list[dict[str, str]]:
    """The plugin lock of every installed plugin (what ``plasmid train`` sends to its actors);
    configurations built by ``plasmid.testing.make_config`` carry a lock of test entries that
    no actor could load."""
    from plasmid.plugins import PluginManager, Selection

    manager = PluginManager()
    manager.load(Selection())
    return manager.lock()
