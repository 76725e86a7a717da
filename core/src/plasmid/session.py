"""A run's providers, built: the :class:`Session` the loop drives, the :class:`Runtime` protocol
that builds one, and the builders every runtime shares (in this process).

Before a runtime starts, ``plasmid train`` calls :func:`prepare` (the chosen data source creates
what its recipe named, the quickstart's tiny model) and :func:`build_inputs` (the tokenizer and
the data source, which read the user's model directory and data, are built in the driver and
kept on the :class:`~plasmid.startup.Startup`), so that bad input stops the run before any
engine or trainer starts; :func:`build_rollout_context` then reuses them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from plasmid.config import Config
from plasmid.context import RolloutContext
from plasmid.errors import PlasmidError, ProviderError, UsageError
from plasmid.kernel_options import RolloutOptions, ScheduleOptions
from plasmid.prompt_limits import report_prompts
from plasmid.protocols import DataSource, RolloutDriver, RolloutEngine, Tokenizer, Tool, Trainer, WeightSync
from plasmid.providers import instantiate as instantiate  # re-exported: its home before plasmid.providers
from plasmid.registry import Registry
from plasmid.rewards import RewardComponent, RewardSet
from plasmid.startup import Startup, tool_names
from plasmid.stop_tokens import stop_token_ids
from plasmid.types import SamplingParams


@dataclass
class Session:
    """Every provider of a run, built and ready; :mod:`plasmid.loop` drives it."""

    startup: Startup
    ctx: RolloutContext
    driver: RolloutDriver
    trainer: Trainer
    weight_sync: WeightSync
    runtime: Runtime | None = None

    @property
    def config(self) -> Config:
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


class Runtime(Protocol):
    """Where a run's providers live: builds them (in this process, in Ray actors, ...) and
    tears them down. The loop talks only to what :meth:`start` returns. Registered with
    ``plasmid_runtimes``; ``factory(config)`` builds one."""

    async def start(self, startup: Startup) -> Session:
        """Build every chosen provider (engines, trainer, driver, sync) and return the session."""
        ...

    async def shutdown(self) -> None:
        """Stop what :meth:`start` started (servers, actors, process groups)."""
        ...


def build_reward_set(config: Config, registry: Registry) -> RewardSet:
    """The ``--reward NAME[:WEIGHT]`` functions, built and combined (``plasmid train`` and
    ``plasmid score`` share it)."""
    rollout = RolloutOptions.of(config)
    return RewardSet(
        components=[RewardComponent(name, weight, instantiate(registry.get("reward", name), config),
                                    registry.get("reward", name).plugin.label)
                    for name, weight in config.option.reward_weights],
        reward_key=rollout.reward_key,
        timeout=rollout.reward_timeout,
        errors=rollout.reward_errors,
    )


def prepare(config: Config, registry: Registry) -> None:
    """Create what the chosen data source needs on disk and does not find there: its factory's
    ``prepare(config)``, when it has one (the ``tasks`` source builds the tiny model its recipe
    named as ``--model``). ``plasmid train`` calls it once every check passed (options, plugins,
    run directory) and before any provider is built; :func:`build_rollout_context` calls it too,
    for callers that build providers themselves, so a ``prepare`` must create only what is
    missing. A failure names the data source and its plugin."""
    name = config.option.datasource
    if not name:
        return
    provider = registry.get("datasource", name)
    step = getattr(provider.load(), "prepare", None)
    if step is None:
        return
    try:
        step(config)
    except Exception as exc:
        if isinstance(exc, PlasmidError):
            raise
        raise ProviderError(
            f"datasource '{name}' from plugin {provider.plugin.label} failed to prepare the run: "
            f"{type(exc).__name__}: {exc}",
            provider=name, plugin=provider.plugin.name,
        ) from exc


def build_inputs(startup: Startup) -> None:
    """Build, in this process, the providers that read the user's input: the tokenizer (the
    ``--model`` directory) and the data source (every row of its data, checked), and keep them
    in ``startup.prebuilt`` (``"tokenizer"``, ``"datasource"``) for :func:`build_rollout_context`.
    Those already there are kept. Errors are the providers' own (one line, naming the file). What
    a new data source found in its prompts is printed, its metrics kept in ``startup.metrics``
    (:func:`plasmid.prompt_limits.report_prompts`)."""
    config, registry, built = startup.config, startup.registry, startup.prebuilt
    if "tokenizer" not in built:
        built["tokenizer"] = build_tokenizer(config, registry)
    if "datasource" not in built:
        built["datasource"] = instantiate(registry.get("datasource", config.option.datasource), config)
        startup.metrics.update(report_prompts(config, built["datasource"]))


def build_tokenizer(config: Config, registry: Registry) -> Tokenizer:
    """The run's tokenizer (``--tokenizer``; by default the model's own)."""
    tokenizer: Tokenizer = instantiate(registry.choose("tokenizer", config.option.tokenizer), config)
    return tokenizer


def build_tools(config: Config, registry: Registry) -> dict[str, Tool]:
    """The run's ``--tools``, each built once by its factory, keyed by the name the model calls
    (:attr:`~plasmid.protocols.Tool.name`), in the order given.

    One-line errors: an unknown or repeated name (``--tools a,a``), a factory that fails (named
    with its plugin), a provider that is no :class:`~plasmid.protocols.Tool` (``name``,
    ``description``, ``parameters``, async ``__call__``) or has an empty or non-string ``name``, and
    two tools that the model would call by the same name."""
    tools: dict[str, Tool] = {}
    for registered in tool_names(list(getattr(config.option, "tools", None) or [])):
        provider = registry.get("tool", registered)
        tool = instantiate(provider, config)
        where = f"tool '{registered}' from plugin {provider.plugin.label}"
        if not isinstance(tool, Tool) or not callable(tool):
            raise ProviderError(f"{where} built {type(tool).__name__}, which is no plasmid Tool (it needs name, "
                                f"description, parameters and async __call__(arguments, sample))",
                                provider=registered, plugin=provider.plugin.name)
        name = tool.name
        if not isinstance(name, str) or not name:
            raise ProviderError(f"{where} has the name {name!r}; a tool's name is a non-empty string",
                                provider=registered, plugin=provider.plugin.name)
        if name in tools:
            raise UsageError(f"--tools: tool '{registered}' is called '{name}' by the model, as is another tool "
                             f"of --tools; give each tool once")
        tools[name] = tool
    return tools


def build_rollout_context(config: Config, registry: Registry, engines: Sequence[RolloutEngine] | None = None,
                          *, prebuilt: Mapping[str, Any] | None = None) -> RolloutContext:
    """Build the rollout side in this process: data source, ``--engines`` engines, generate
    function, rewards, filters and tools (:func:`build_tools`), with the training sampling
    parameters (stopping on :func:`plasmid.stop_tokens.stop_token_ids`).

    ``engines``: engines built elsewhere (a runtime's proxies for engines in other processes)
    to use instead of building ``--engines`` of them here. ``prebuilt``: the tokenizer and data
    source that :func:`build_inputs` built (``startup.prebuilt``), used instead of building them
    again. Runs :func:`prepare` first."""
    option, rollout = config.option, RolloutOptions.of(config)
    prebuilt = prebuilt or {}
    prepare(config, registry)
    tokenizer: Tokenizer = prebuilt["tokenizer"] if "tokenizer" in prebuilt else build_tokenizer(config, registry)
    data_source: DataSource | None = prebuilt.get("datasource")  # else built below, after the engines

    def chosen(family: str, name: str) -> Any:
        return instantiate(registry.get(family, name), config)

    rewards = build_reward_set(config, registry)
    sampling = SamplingParams(temperature=rollout.temperature, top_p=rollout.top_p, top_k=rollout.top_k,
                              max_new_tokens=rollout.max_new_tokens, stop_token_ids=stop_token_ids(config, tokenizer))
    return RolloutContext(
        config=config,
        engines=list(engines) if engines is not None else [chosen("engine", option.engine)
                                                             for _ in range(ScheduleOptions.of(config).engines)],
        data_source=data_source if data_source is not None else chosen("datasource", option.datasource),
        tokenizer=tokenizer,
        generate=chosen("generate", option.generate),
        rewards=rewards,
        filters=[(name, chosen("filter", name)) for name in option.filter],
        sampling=sampling,
        tools=build_tools(config, registry),
    )


def build_session(startup: Startup) -> Session:
    """Build every chosen provider in this process."""
    config, registry = startup.config, startup.registry
    option = config.option
    loss = instantiate(registry.get("loss", option.loss), config)
    return Session(
        startup=startup,
        ctx=build_rollout_context(config, registry, prebuilt=startup.prebuilt),
        driver=instantiate(registry.get("rollout", option.rollout), config),
        trainer=instantiate(registry.get("trainer", option.trainer), config, loss),
        weight_sync=instantiate(registry.get("weight_sync", option.weight_sync), config),
    )
