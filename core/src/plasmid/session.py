"""Building the providers of a configured run, once, in this process; the ``local`` runtime."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from plasmid.config import Config
from plasmid.context import RolloutContext
from plasmid.errors import ProviderError, UsageError
from plasmid.hf import load_tokenizer
from plasmid.protocols import DataSource, Loss, RolloutDriver, RolloutEngine, Trainer, WeightSync
from plasmid.registry import Provider, Registry
from plasmid.rewards import RewardComponent, RewardSet
from plasmid.startup import Startup
from plasmid.types import SamplingParams


@dataclass
class Session:
    """Every provider of a run, built and ready; :mod:`plasmid.loop` drives it."""

    startup: Startup
    ctx: RolloutContext
    driver: RolloutDriver
    trainer: Trainer
    weight_sync: WeightSync
    loss: Loss
    runtime: Any = None

    @property
    def config(self):
        return self.startup.config

    @property
    def engines(self) -> list[RolloutEngine]:
        return list(self.ctx.engines)

    @property
    def data_source(self) -> DataSource:
        return self.ctx.data_source

    async def shutdown(self) -> None:
        """Shut the engines down, then the runtime that placed them."""
        for engine in self.ctx.engines:
            await engine.shutdown()
        if self.runtime is not None:
            await self.runtime.shutdown()


def instantiate(provider: Provider, *args: Any) -> Any:
    """``factory(*args)`` for ``provider``; a failure names the provider and its plugin."""
    factory = provider.load()
    try:
        return factory(*args)
    except Exception as exc:
        from plasmid.errors import PlasmidError

        if isinstance(exc, PlasmidError):
            raise
        raise ProviderError(
            f"{provider.family} '{provider.name}' from plugin {provider.plugin.label} failed to start: "
            f"{type(exc).__name__}: {exc}",
            provider=provider.name, plugin=provider.plugin.name,
        ) from exc


def build_reward_set(config: Config, registry: Registry) -> RewardSet:
    """The ``--reward NAME[:WEIGHT]`` functions, built and combined (``plasmid train`` and
    ``plasmid score`` share it)."""
    option = config.option
    return RewardSet(
        components=[RewardComponent(name, weight, instantiate(registry.get("reward", name), config),
                                    registry.get("reward", name).plugin.label)
                    for name, weight in option.reward_weights],
        reward_key=option.reward_key,
        timeout=option.reward_timeout,
        errors=option.reward_errors,
    )


def build_rollout_context(config: Config, registry: Registry,
                          engines: Sequence[RolloutEngine] | None = None) -> RolloutContext:
    """Build the rollout side in this process: data source, ``--engines`` engines, generate
    function, rewards and filters, with the training sampling parameters.

    ``engines``: engines built elsewhere (a runtime's proxies for engines in other processes)
    to use instead of building ``--engines`` of them here."""
    option = config.option
    tokenizer = load_tokenizer(str(option.model))

    def chosen(family: str, name: str) -> Any:
        return instantiate(registry.get(family, name), config)

    rewards = build_reward_set(config, registry)
    stop = (tokenizer.eos_token_id,) if tokenizer.eos_token_id is not None else ()
    sampling = SamplingParams(temperature=option.temperature, top_p=option.top_p, top_k=option.top_k,
                              max_new_tokens=option.max_new_tokens, stop_token_ids=stop)
    return RolloutContext(
        config=config,
        engines=list(engines) if engines is not None else [chosen("engine", option.engine)
                                                             for _ in range(option.engines)],
        data_source=chosen("datasource", option.datasource),
        tokenizer=tokenizer,
        generate=chosen("generate", option.generate),
        rewards=rewards,
        filters=[(name, chosen("filter", name)) for name in option.filter],
        sampling=sampling,
    )


def build_session(startup: Startup) -> Session:
    """Build every chosen provider in this process."""
    config, registry = startup.config, startup.registry
    option = config.option
    loss = instantiate(registry.get("loss", option.loss), config)
    return Session(
        startup=startup,
        ctx=build_rollout_context(config, registry),
        driver=instantiate(registry.get("rollout", option.rollout), config),
        trainer=instantiate(registry.get("trainer", option.trainer), config, loss),
        weight_sync=instantiate(registry.get("weight_sync", option.weight_sync), config),
        loss=loss,
    )


class LocalRuntime:
    """Runtime ``local``: every provider in this process, one trainer, ``--engines`` engines."""

    def __init__(self, config: Config) -> None:
        if config.option.trainer_workers != 1:
            raise UsageError(f"--trainer-workers {config.option.trainer_workers} needs a multi-process runtime; "
                             f"the local runtime runs one trainer (try --runtime ray)")

    async def start(self, startup: Startup) -> Session:
        session = build_session(startup)
        session.runtime = self
        return session

    async def shutdown(self) -> None:
        """Nothing beyond the engines, which the session shuts down."""
