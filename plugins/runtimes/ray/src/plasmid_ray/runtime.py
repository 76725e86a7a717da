"""``RayRuntime``: runtime ``ray`` (``--runtime ray``).

What lives where:

- **actors** (one placement group, :mod:`plasmid_ray.placement`): ``--engines`` engine actors,
  each hosting one rollout engine (:class:`~plasmid_ray.actors.EngineHost`), and
  ``--trainer-workers`` data-parallel trainer workers (:class:`~plasmid_ray.actors.TrainerWorker`,
  ``torch.distributed``: gloo on CPU, NCCL on GPU). Each loads the driver's plugin lock first.
- **the driver process**: the loop, the data source, the tokenizer, the rewards and filters, the
  weight sync's orchestration, and the *rollout manager* (:class:`RolloutManager`): the chosen
  rollout driver run against every engine proxy, with least-in-flight balancing
  (:mod:`plasmid_ray.balance`) and engine restarts (:mod:`plasmid_ray.engines`), and the weight
  sync wrapped so that an engine restarted during a sync still ends up with the new version
  (:class:`RestartSafeSync`).

Why the rollout manager is not an actor of its own: the rollout driver only awaits engines and
rewards (it is I/O-bound in the driver's event loop), the data source's state must be
checkpointed with the loop's, and rewards may start local sandboxes or call local services; an
extra actor would add a hop and a pickled batch per step and buy nothing on the rollout path,
where every request already crosses to an engine actor.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, ClassVar

from plasmid.config import Config
from plasmid.context import RolloutContext
from plasmid.kernel_options import ScheduleOptions
from plasmid.options import Options
from plasmid.protocols import RolloutDriver, RolloutEngine, SupportsRestarts, Trainer, WeightSync
from plasmid.registry import Registry
from plasmid.session import Session, build_rollout_context, instantiate, prepare
from plasmid.startup import Startup
from plasmid.types import Group, RolloutBatch, SamplingParams, SyncReport
from plasmid_ray.balance import BalancedRolloutContext
from plasmid_ray.cluster import Connection, connect, disconnect
from plasmid_ray.engines import EnginePool, EngineProxy, report
from plasmid_ray.options import RayOptions
from plasmid_ray.placement import Placement, actor_resources, place, total_cpus
from plasmid_ray.trainer import TrainerProxy, start_trainers


class RolloutManager:
    """The run's rollout driver over the engine pool; adds to each step's metrics the requests
    each engine served in the step (``ray/engine{i}/requests``) and the engine restarts so far
    (``ray/engine_restarts``)."""

    def __init__(self, driver: RolloutDriver, pool: EnginePool) -> None:
        self.driver, self.pool = driver, pool
        self._served = {proxy.index: proxy.requests for proxy in pool.proxies}

    async def run(self, ctx: RolloutContext, rollout_id: int) -> RolloutBatch:
        batch = await self.driver.run(ctx, rollout_id)
        for proxy in self.pool.proxies:
            batch.metrics[f"ray/engine{proxy.index}/requests"] = float(proxy.requests - self._served[proxy.index])
            self._served[proxy.index] = proxy.requests
        batch.metrics["ray/engine_restarts"] = float(sum(proxy.restarts for proxy in self.pool.proxies))
        return batch

    async def evaluate(self, ctx: RolloutContext, groups: list[Group], params: SamplingParams) -> dict[str, float]:
        return await self.driver.evaluate(ctx, groups, params)


class RestartSafeSync:
    """The run's weight sync, made safe against an engine dying during it.

    A half-done sync cannot be resumed on a restarted engine (it would miss the buckets sent
    before it died), so when an engine is restarted during :meth:`sync` the whole version is
    sent to it again once the sync is over; if the sync failed because of the death (its call
    on the dead engine is not retried), the sync is run again for every engine (syncs are
    idempotent for one version). Other failures are raised unchanged.
    """

    def __init__(self, inner: WeightSync, pool: EnginePool) -> None:
        self.inner, self.pool = inner, pool

    async def sync(self, trainer: Trainer, engines: Sequence[RolloutEngine], weight_version: int) -> SyncReport:
        before = {id(engine): restarts(engine) for engine in engines}

        def restarted() -> list[RolloutEngine]:
            return [e for e in engines if restarts(e) != before[id(e)]]

        try:
            sync_report = await self.inner.sync(trainer, engines, weight_version)
        except Exception as exc:
            if not restarted():
                raise
            names = ", ".join(engine_name(e) for e in restarted())
            report(f"weight sync to version {weight_version} failed because engine {names} was restarted during it "
                   f"({type(exc).__name__}); syncing every engine again")
            return await self.inner.sync(trainer, engines, weight_version)
        if again := restarted():
            report(f"engine {', '.join(engine_name(e) for e in again)} was restarted during the weight sync to "
                   f"version {weight_version}; sending it that version whole")
            await self.inner.sync(trainer, again, weight_version)
        return sync_report


async def gather_or_cancel(*awaitables: Any) -> list[Any]:
    """``asyncio.gather``, but when one fails the others are cancelled and awaited before the
    error is raised (so none of them goes on calling Ray after the runtime shut it down, which
    would start a new cluster)."""
    tasks = [asyncio.ensure_future(awaitable) for awaitable in awaitables]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def restarts(engine: RolloutEngine) -> int:
    """How often ``engine`` was restarted (:class:`plasmid.protocols.SupportsRestarts`); 0 for an
    engine that is never restarted."""
    return engine.restarts if isinstance(engine, SupportsRestarts) else 0


def engine_name(engine: RolloutEngine) -> str:
    """The engine's number in the pool (the runtime's proxies have one), else its repr."""
    return str(engine.index) if isinstance(engine, EngineProxy) else repr(engine)


class RayRuntime:
    """Built by the kernel as ``RayRuntime(config)``; :meth:`start` places and builds everything."""

    option_classes: ClassVar[tuple[type[Options], ...]] = (RayOptions, ScheduleOptions)

    def __init__(self, config: Config) -> None:
        self.config = config
        self.connection: Connection | None = None
        self.placement: Placement | None = None
        self.pool: EnginePool | None = None
        self.trainer: TrainerProxy | None = None

    async def start(self, startup: Startup) -> Session:
        config, registry = startup.config, startup.registry
        trainer_resources, engine_resources = actor_resources(config, 0.0)
        self.connection = connect(config, total_cpus(config, trainer_resources, engine_resources))
        try:
            return await self._start(startup, config, registry)
        except BaseException:
            await self.shutdown()
            raise

    async def _start(self, startup: Startup, config: Config, registry: Registry) -> Session:
        option = config.option  # provider choices
        prepare(config, registry)  # what the actors load must exist first (a recipe's tiny model); idempotent
        self.placement = place(config, self.connection.gpus)
        report(f"placement ({ScheduleOptions.of(config).placement}): {self.placement.describe()}")
        self.pool = EnginePool(config, self.placement)
        trainers = start_trainers(config, self.placement, provider=registry.get("trainer", option.trainer))
        proxies, self.trainer = await gather_or_cancel(self.pool.start(), trainers)
        ctx = BalancedRolloutContext.wrap(build_rollout_context(config, registry, engines=proxies,
                                                                prebuilt=startup.prebuilt))
        weight_sync = instantiate(registry.get("weight_sync", option.weight_sync), config)
        trainer = self.trainer

        async def resync(proxy: EngineProxy, version: int) -> None:
            sync_report = await weight_sync.sync(trainer, [proxy], version)
            report(f"engine {proxy.index} re-synced to weight version {version} with '{option.weight_sync}' "
                   f"({sync_report.bytes} bytes in {sync_report.seconds:.2f} s)")

        self.pool.resync = resync
        if option.weight_sync == "inprocess":
            report("--weight-sync inprocess moves every bucket through the driver process; "
                   "--weight-sync objectstore or broadcast send them between the actors")
        return Session(
            startup=startup,
            ctx=ctx,
            driver=RolloutManager(instantiate(registry.get("rollout", option.rollout), config), self.pool),
            trainer=trainer,
            weight_sync=RestartSafeSync(weight_sync, self.pool),
            runtime=self,
        )

    async def shutdown(self) -> None:
        """End the trainer workers and any engine actor still alive, free the placement group,
        and stop Ray if this runtime started it."""
        import ray

        if self.trainer is not None:
            await self.trainer.shutdown()
            self.trainer = None
        if self.pool is not None:
            EnginePool.kill(proxy.actor for proxy in self.pool.proxies)
            self.pool = None
        if self.placement is not None and self.placement.group is not None and ray.is_initialized():
            ray.util.remove_placement_group(self.placement.group)
            self.placement = None
        if self.connection is not None:
            disconnect(self.connection)
            self.connection = None
