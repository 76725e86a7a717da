"""The loop keeps the cyclic garbage collector off the start-up objects while it runs
(:func:`plasmid.loop_gc.startup_objects_frozen`): full collections then visit only what the loop
made (on the quickstart they took ~150 ms each, every 15-20 steps), young ones run at
:data:`~plasmid.loop_gc.LOOP_THRESHOLDS`, garbage cycles of start-up are freed before the freeze,
and the frozen objects and the thresholds are handed back when the loop ends, by an error too.
``plasmid train`` starts a run under :func:`plasmid.app.collector.quiet_start_up`."""

from __future__ import annotations

import asyncio
import gc
import io
import weakref
from pathlib import Path
from types import SimpleNamespace

import pytest

from plasmid import hookimpl, loop
from plasmid.app import run as run_module
from plasmid.app.collector import START_UP_THRESHOLDS, quiet_start_up
from plasmid.app.runlog import RunLog
from plasmid.errors import UsageError
from plasmid.loop_gc import LOOP_THRESHOLDS
from plasmid.registry import Registry
from plasmid.session import Session
from plasmid.startup import Startup
from plasmid.testing import make_config, make_manager
from plasmid.types import Group, RolloutBatch, Sample, SyncReport


class Created:
    """An object in a reference cycle, made before the loop starts."""

    def __init__(self) -> None:
        self.me = self


class WatchingTrainer:
    """Records, at each train step, how many objects are frozen and whether ``watched`` is among
    the objects a full collection visits (``gc.get_objects()`` leaves out frozen ones)."""

    watched: object = None
    #: a weak reference to a garbage cycle made before the loop started
    dropped: weakref.ref | None = None

    def __init__(self, config, loss=None):
        self.seen: list[tuple[int, bool]] = []
        self.thresholds: list[tuple[int, int, int]] = []
        self.dropped_alive: list[bool] = []
        self.fail = False

    async def train_step(self, batch):
        visible = any(obj is WatchingTrainer.watched for obj in gc.get_objects())
        self.seen.append((gc.get_freeze_count(), visible))
        self.thresholds.append(gc.get_threshold())
        self.dropped_alive.append(WatchingTrainer.dropped is not None and WatchingTrainer.dropped() is not None)
        if self.fail:
            raise RuntimeError("trainer failed")
        return {"train/loss": 0.5}

    async def save(self, path):
        Path(path).mkdir(parents=True)

    async def load(self, path):
        pass


class Driver:
    async def run(self, ctx, rollout_id):
        return RolloutBatch(rollout_id, [Group([Sample(reward=1.0)])], {"rollout/reward_mean": 1.0})

    async def evaluate(self, ctx, groups, params):
        return {}


class Sync:
    async def sync(self, trainer, engines, version):
        return SyncReport(bytes=0, seconds=0.0, weight_version=version)


class Data:
    def eval_groups(self):
        return []

    def state_dict(self):
        return {}


class Plugin:
    @hookimpl
    def plasmid_trainers(self, register):
        register("watching", WatchingTrainer)


def run_loop(run_dir: Path, *, fail: bool = False) -> WatchingTrainer:
    plugin = Plugin()
    config = make_config(plugin, run_dir=run_dir, trainer="watching", num_rollouts=3, eval_interval=0,
                         save_interval=0)
    manager = make_manager(plugin)
    startup = Startup(config, manager, Registry.collect(manager))
    trainer = WatchingTrainer(config)
    trainer.fail = fail
    session = Session(startup=startup, ctx=SimpleNamespace(data_source=Data(), engines=[], eval_sampling=lambda: None),
                      driver=Driver(), trainer=trainer, weight_sync=Sync())
    run_dir.mkdir(parents=True)
    asyncio.run(loop.train(session, RunLog(run_dir, 3, stream=io.StringIO())))
    return trainer


@pytest.fixture
def watched():
    WatchingTrainer.watched = Created()
    yield WatchingTrainer.watched
    WatchingTrainer.watched = None


def test_start_up_objects_are_frozen_during_the_loop_and_handed_back_after(tmp_path, watched):
    assert gc.get_freeze_count() == 0
    before = gc.get_threshold()
    trainer = run_loop(tmp_path / "run")
    assert len(trainer.seen) == 3
    assert all(frozen > 0 and not visible for frozen, visible in trainer.seen)
    assert trainer.thresholds == [LOOP_THRESHOLDS] * 3
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == before
    assert any(obj is watched for obj in gc.get_objects())


def test_garbage_cycles_of_start_up_are_freed_before_the_freeze(tmp_path):
    gc.disable()  # no collection of our own may free the cycle before the loop does
    try:
        cycle = Created()
        WatchingTrainer.dropped = weakref.ref(cycle)
        del cycle
        assert WatchingTrainer.dropped() is not None  # only the cycle collector can free it
        trainer = run_loop(tmp_path / "run")
    finally:
        gc.enable()
        WatchingTrainer.dropped = None
    assert trainer.dropped_alive == [False] * 3


def test_a_failing_loop_hands_the_frozen_objects_back_too(tmp_path, watched):
    before = gc.get_threshold()
    with pytest.raises(RuntimeError, match="trainer failed"):
        run_loop(tmp_path / "run", fail=True)
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == before
    assert any(obj is watched for obj in gc.get_objects())


def test_quiet_start_up_raises_the_thresholds_and_puts_them_back_by_an_error_too():
    before = gc.get_threshold()
    with quiet_start_up():
        assert gc.get_threshold() == START_UP_THRESHOLDS
    assert gc.get_threshold() == before
    with pytest.raises(ValueError), quiet_start_up():
        raise ValueError("start-up failed")
    assert gc.get_threshold() == before


def test_plasmid_train_starts_a_run_under_quiet_start_up(monkeypatch):
    seen = []

    def start(argv, add_options=None):
        seen.append(gc.get_threshold())
        raise UsageError("stop here")

    monkeypatch.setattr(run_module, "start", start)
    before = gc.get_threshold()
    with pytest.raises(UsageError, match="stop here"):
        asyncio.run(run_module.run_training([]))
    assert seen == [START_UP_THRESHOLDS]
    assert gc.get_threshold() == before
