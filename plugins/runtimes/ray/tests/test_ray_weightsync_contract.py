"""Every weight sync of plasmid-sync against the weight-sync contract, with the torchtrain trainer
and two torchgen engines in Ray actors (the runtime's proxies): the cross-process syncs
(``objectstore``, ``broadcast``) and the file-based ones (``disk``, ``delta``) through actors.

The actors are built once and reused by every test (each test trains the trainer again, so the
engines always start a test behind the trainer; each test builds a fresh sync)."""

from __future__ import annotations

import asyncio

import pytest

ray = pytest.importorskip("ray")

import plasmid_grpo.plugin  # noqa: E402
import plasmid_sync.plugin  # noqa: E402
import plasmid_torchgen.plugin  # noqa: E402
import plasmid_torchtrain.plugin  # noqa: E402
from plasmid_ray.engines import EnginePool  # noqa: E402
from plasmid_ray.placement import Placement, Resources  # noqa: E402
from plasmid_ray.trainer import start_trainers  # noqa: E402

from plasmid_torch.testing.contracts.weightsync import WeightSyncContract  # noqa: E402


@pytest.fixture(scope="module")
def actors(ray_cluster):
    """The trainer and engines of every test of this module, built by the first test that asks."""
    built: dict = {}
    yield built

    async def shutdown():
        for engine in built.get("engines", []):
            await engine.shutdown()
        if "trainer" in built:
            await built["trainer"].shutdown()

    asyncio.run(shutdown())


class RayWeightSyncContract(WeightSyncContract):
    """The contract with the trainer and the engines in actors (one CPU each, no placement group)."""

    plugin = plasmid_sync.plugin
    extra_plugins = (plasmid_grpo.plugin, plasmid_torchtrain.plugin, plasmid_torchgen.plugin)
    engine_count = 2

    @pytest.fixture(scope="class", autouse=True)
    @classmethod
    def _share_actors(cls, actors, installed_lock):
        cls._built, cls._lock = actors, installed_lock

    def placement(self, count: int) -> Placement:
        return Placement.unplaced(1, count, Resources(1.0), Resources(1.0))

    def make_trainer(self, config):
        config.plugin_lock = self._lock
        if "trainer" not in self._built:
            self._built["trainer"] = asyncio.run(start_trainers(config, self.placement(self.engine_count)))
        return self._built["trainer"]

    def make_engines(self, config, count):
        config.plugin_lock = self._lock
        if "engines" not in self._built:
            self._built["engines"] = asyncio.run(EnginePool(config, self.placement(count)).start())
        return self._built["engines"]

    def close(self, setup):
        """The module fixture ends the actors after the last test."""


class TestObjectStoreSyncInRay(RayWeightSyncContract):
    provider = "objectstore"


class TestBroadcastSyncInRay(RayWeightSyncContract):
    provider = "broadcast"


class TestDiskSyncInRay(RayWeightSyncContract):
    provider = "disk"


class TestDeltaSyncInRay(RayWeightSyncContract):
    provider = "delta"
    compresses = True


class TestInProcessSyncThroughRayProxies(RayWeightSyncContract):
    """``inprocess`` works through the proxies too: buckets pass through this process."""

    provider = "inprocess"
