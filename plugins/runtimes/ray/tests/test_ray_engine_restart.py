"""An engine actor killed mid-rollout: the death is reported naming the engine, the engine is
restarted in its bundle, its weights are re-synced from the trainer before it serves again, the
requests it had in flight are retried, and the step completes."""

from __future__ import annotations

import asyncio
import re

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from plasmid.session import instantiate  # noqa: E402
from plasmid.startup import start  # noqa: E402
from plasmid.types import Status  # noqa: E402
from plasmid_torch.testing.contracts.trainer import exported  # noqa: E402

PROMPTS, SAMPLES = 8, 4


def options(run_dir, sync, *extra):
    # one request decoded at a time per engine and long responses: the rollout takes long enough
    # for the kill to land while engine 1 has requests in flight
    return ["--runtime", "ray", "--engines", "2", "--trainer-workers", "1", "--placement", "disaggregate",
            "--weight-sync", sync, "--prompts-per-step", str(PROMPTS), "--n-samples-per-prompt",
            str(SAMPLES), "--max-new-tokens", "24", "--torchgen-max-batch-size", "1", "--eval-interval", "0",
            "--run-dir", str(run_dir), *extra]


# objectstore: stateless between syncs; broadcast: its process group loses a member and is remade
@pytest.mark.parametrize("sync", ["objectstore", "broadcast"])
def test_a_killed_engine_is_restarted_resynced_and_the_step_completes(ray_cluster, tmp_path, capfd, sync):
    startup = start(options(tmp_path / "run", sync))
    runtime = instantiate(startup.registry.get("runtime", "ray"), startup.config)

    async def scenario():
        session = await runtime.start(startup)
        try:
            ctx, trainer, engines = session.ctx, session.trainer, session.engines
            first = await session.driver.run(ctx, 0)
            await trainer.train_step(first)
            await session.weight_sync.sync(trainer, engines, 1)       # engines now serve version 1
            victim = engines[1]
            old_actor = victim.actor_id
            rollout = asyncio.ensure_future(session.driver.run(ctx, 1))
            while victim.in_flight == 0:
                await asyncio.sleep(0.005)
            in_flight_at_kill = victim.in_flight
            ray.kill(victim.actor)
            batch = await rollout
            served = await victim.get_weights(list(exported_names(trainer)))
            weights = exported(trainer)
            await trainer.train_step(batch)                          # the step goes on: train, sync
            report = await session.weight_sync.sync(trainer, engines, 2)
            return (batch, in_flight_at_kill, old_actor, victim, served, weights, report,
                    [engine.weight_version for engine in engines])
        finally:
            await session.shutdown()

    batch, in_flight_at_kill, old_actor, victim, served, weights, report, versions = asyncio.run(scenario())
    err = capfd.readouterr().err
    assert in_flight_at_kill > 0
    assert re.search(rf"engine 1 \(actor {old_actor}, pid [^)]+\) died during generate: ", err), err
    assert "restarting it in bundle" in err and "engine 1 re-synced to weight version 1" in err
    assert victim.restarts == 1 and victim.actor_id != old_actor
    assert batch.metrics["ray/engine_restarts"] == 1.0
    assert len(batch.groups) == PROMPTS and all(len(g.samples) == SAMPLES for g in batch.groups)
    samples = batch.samples
    assert all(s.status in (Status.COMPLETED, Status.TRUNCATED) and s.response_length > 0 for s in samples)
    # every sample, the retried ones included, was generated with the re-synced weights
    assert {s.weight_version for s in samples} == {1}
    for name, value in weights.items():
        assert np.array_equal(served[name], value), f"the restarted engine's {name} is not the trainer's"
    assert versions == [2, 2] and report.weight_version == 2


def exported_names(trainer):
    return [name for bucket in trainer.export_weights(1 << 30) for name, _ in bucket]


@pytest.mark.parametrize("sync", ["objectstore", "delta"])
def test_an_engine_dead_when_a_weight_sync_starts_gets_the_new_version(ray_cluster, tmp_path, capfd, sync):
    startup = start(options(tmp_path / "run", sync))
    runtime = instantiate(startup.registry.get("runtime", "ray"), startup.config)

    async def scenario():
        session = await runtime.start(startup)
        try:
            ctx, trainer, engines = session.ctx, session.trainer, session.engines
            for version in (1, 2):
                await trainer.train_step(await session.driver.run(ctx, version - 1))
                if version == 2:
                    ray.kill(engines[0].actor)      # dies between steps; the sync finds it dead
                await session.weight_sync.sync(trainer, engines, version)
            names = exported_names(trainer)
            return exported(trainer), [await engine.get_weights(names) for engine in engines], engines
        finally:
            await session.shutdown()

    weights, served, engines = asyncio.run(scenario())
    err = capfd.readouterr().err
    assert "engine 0" in err and "died during call" in err
    assert "syncing every engine again" in err or "sending it that version whole" in err
    assert engines[0].restarts == 1 and [engine.weight_version for engine in engines] == [2, 2]
    for index, engine_weights in enumerate(served):
        for name, value in weights.items():
            assert np.array_equal(engine_weights[name], value), f"engine {index}: {name}"


def test_an_engine_killed_while_starting_is_started_again(ray_cluster, tmp_path, capfd, monkeypatch):
    """An engine actor whose process dies before it is ready (killed, out of memory) is started
    again in its bundle instead of failing the run's start."""
    from plasmid_ray.engines import EnginePool

    spawn, killed = EnginePool.spawn, []

    def spawn_and_kill_the_first(self, index):
        actor = spawn(self, index)
        if index == 1 and not killed:
            killed.append(actor)
            ray.kill(actor)                  # the process dies before ready() returns
        return actor

    monkeypatch.setattr(EnginePool, "spawn", spawn_and_kill_the_first)
    startup = start(options(tmp_path / "run", "objectstore"))
    runtime = instantiate(startup.registry.get("runtime", "ray"), startup.config)

    async def scenario():
        session = await runtime.start(startup)
        try:
            return await session.driver.run(session.ctx, 0)
        finally:
            await session.shutdown()

    batch = asyncio.run(scenario())
    assert killed and len(batch.groups) == PROMPTS
    assert "engine 1 died while starting" in capfd.readouterr().err
