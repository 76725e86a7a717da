"""Every weight sync of plasmid-sync against the weight-sync contract, with the torchtrain trainer
and two torchgen engines in Ray actors (the runtime's proxies): the cross-process syncs
(``objectstore``, ``broadcast``) and the file-based ones (``disk``, ``delta``) through actors.

The actors are built once and reused by every test (each test trains the trainer again, so the
engines always start a test behind the trainer; each test builds a fresh sync).

The deadline tests hang a real actor: the contract's stuck engine is a real engine actor whose
loads wait on an event inside its process (``plasmid_ray.testing.hold_loads``), and
:class:`TestStoppedProcesses` freezes an actor's whole process (``SIGSTOP``) before a sync, so
each ``SyncTimeout`` comes from the transport's own code over real Ray."""

from __future__ import annotations

import asyncio
import time

import pytest

ray = pytest.importorskip("ray")

import plasmid_grpo.plugin  # noqa: E402
import plasmid_sync.plugin  # noqa: E402
import plasmid_torchgen.plugin  # noqa: E402
import plasmid_torchtrain.plugin  # noqa: E402
from plasmid_ray.engines import EnginePool  # noqa: E402
from plasmid_ray.placement import Placement, Resources  # noqa: E402
from plasmid_ray.testing import hold_loads, process_id, release_loads, stopped  # noqa: E402
from plasmid_ray.trainer import start_trainers  # noqa: E402

from plasmid import testing  # noqa: E402
from plasmid.remote import run_on  # noqa: E402
from plasmid_torch.sync_guard import SyncTimeout  # noqa: E402
from plasmid_torch.testing.contracts.weightsync import WeightSyncContract  # noqa: E402
from plasmid_torch.tiny import build_tiny_model  # noqa: E402


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

    def hold_engine(self, setup, index):
        """Block engine ``index``'s loads on an event inside its actor (a real engine, stuck in its
        load); what is returned lets them go."""
        engine = setup.engines[index]
        testing.run(run_on(engine, hold_loads))
        return lambda: testing.run(run_on(engine, release_loads))


class TestObjectStoreSyncInRay(RayWeightSyncContract):
    provider = "objectstore"


class TestBroadcastSyncInRay(RayWeightSyncContract):
    provider = "broadcast"
    #: the trainer and engine 0 stay blocked in the group's broadcast when engine 1 is stuck: they
    #: give up after this (the next test waits for the trainer until then)
    stuck_options = {"broadcast_timeout": 8.0}


class TestDiskSyncInRay(RayWeightSyncContract):
    provider = "disk"


class TestDeltaSyncInRay(RayWeightSyncContract):
    provider = "delta"
    compresses = True


class TestInProcessSyncThroughRayProxies(RayWeightSyncContract):
    """``inprocess`` works through the proxies too: buckets pass through this process."""

    provider = "inprocess"


class TestStoppedProcesses:
    """A sync whose trainer or engine process is frozen (``SIGSTOP``) fails within
    ``--sync-timeout`` naming the transport, the phase and who stopped, then the process goes on."""

    timeout = 1.0

    @pytest.fixture(scope="class")
    @classmethod
    def model_dir(cls, tmp_path_factory):
        return build_tiny_model(tmp_path_factory.mktemp("stopped") / "tiny")

    @pytest.fixture
    def parts(self, actors, installed_lock, model_dir, tmp_path):
        """(config, trainer, engines): the module's actors, built here when no test built them."""
        config = testing.make_config(plasmid_sync.plugin, *RayWeightSyncContract.extra_plugins, model=str(model_dir),
                                     run_dir=tmp_path / "run", sync_timeout=self.timeout)
        config.plugin_lock = installed_lock
        placement = Placement.unplaced(1, 2, Resources(1.0), Resources(1.0))
        if "trainer" not in actors:
            actors["trainer"] = testing.run(start_trainers(config, placement))
        if "engines" not in actors:
            actors["engines"] = testing.run(EnginePool(config, placement).start())
        return config, actors["trainer"], actors["engines"]

    def sync_while_stopped(self, parts, provider, target):
        """The message of the ``SyncTimeout`` of one ``provider`` sync while ``target``'s process is
        stopped, and the seconds the sync took to raise it."""
        config, trainer, engines = parts
        sync = testing.build("weight_sync", provider, plasmid_sync.plugin, *RayWeightSyncContract.extra_plugins,
                             config=config)
        pid = testing.run(run_on(target, process_id))
        with stopped(pid):
            began = time.perf_counter()
            with pytest.raises(SyncTimeout) as raised:
                testing.run(sync.sync(trainer, engines, 1))
            waited = time.perf_counter() - began
        testing.run(run_on(target, process_id))  # it answers again
        return str(raised.value), waited

    def test_objectstore_names_the_trainer_whose_process_stopped(self, parts):
        message, waited = self.sync_while_stopped(parts, "objectstore", parts[1])
        assert message.startswith("weight sync 'objectstore': phase 'gather' of the trainer (TrainerProxy, rank 0) "
                                  "did not finish within 1 s"), message
        assert waited < self.timeout + 10, f"the sync gave up after {waited:.1f} s"

    def test_broadcast_names_the_engine_whose_process_stopped_before_it_joined(self, parts):
        message, waited = self.sync_while_stopped(parts, "broadcast", parts[2][1])
        assert message.startswith("weight sync 'broadcast': phase 'connect' of engine 1 (EngineProxy, rank 2) did "
                                  "not finish within 1 s"), message
        assert waited < self.timeout + 10, f"the sync gave up after {waited:.1f} s"
