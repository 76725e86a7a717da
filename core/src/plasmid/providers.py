"""Providers that build providers: how a plugin builds a *sibling* provider of the run.

Some providers are made of others: ``--loss sft-mix`` delegates its RL steps to the loss
``--sft-mix-loss``, ``--generate opd`` scores with a teacher engine of kind ``--teacher-engine``,
and a runtime that places providers in other processes (the Ray actors) builds the run's engine,
loss and trainer there. Each builds the sibling from the *run's plugin lock* (``config.plugin_lock``,
the exact plugins and versions the driver resolved), never from whatever this process would
discover, so the sibling is the provider the driver checked, in every process::

    from plasmid import providers

    rl_loss = providers.build("loss", options.sft_mix_loss, config, flag="--sft-mix-loss")
    trainer = providers.build("trainer", config.option.trainer, config, rl_loss, registry=registry)

- :func:`lock_registry` loads the lock in this process and collects its providers; it fails,
  naming the package, when this process has other versions installed. Load it once and pass it
  as ``registry=`` when building several providers (each call without one loads the lock again).
- :func:`find` looks a provider up (an unknown name is a one-line :class:`~plasmid.errors.PluginError`
  naming ``flag``, the option that chose it), without building it: do it at start-up, and build later.
- :func:`build` is ``find`` and then ``factory(config, *args)``; a failing factory is a
  :class:`~plasmid.errors.ProviderError` naming the provider and its plugin, as for the run's own.

Tests pass a registry of their own (:func:`plasmid.testing.make_registry`) instead of a lock.
"""

from __future__ import annotations

import warnings
from typing import Any

from plasmid.config import Config
from plasmid.errors import PlasmidError, ProviderError
from plasmid.plugins import PluginManager
from plasmid.registry import Provider, Registry

__all__ = ["Provider", "adopt_legacy_score", "build", "find", "instantiate", "lock_registry"]


def instantiate(provider: Provider, *args: Any) -> Any:
    """``factory(*args)`` for ``provider``; a failure names the provider and its plugin. An engine
    that has only the deprecated ``score`` gets its new name (:func:`adopt_legacy_score`)."""
    factory = provider.load()
    try:
        built = factory(*args)
    except Exception as exc:
        if isinstance(exc, PlasmidError):
            raise
        raise ProviderError(
            f"{provider.family} '{provider.name}' from plugin {provider.plugin.label} failed to start: "
            f"{type(exc).__name__}: {exc}",
            provider=provider.name, plugin=provider.plugin.name,
        ) from exc
    if provider.family == "engine":
        adopt_legacy_score(built, f"engine {provider.describe()}")
    return built


def adopt_legacy_score(engine: Any, label: str) -> Any:
    """The deprecation path of ``RolloutEngine.score``, renamed
    :meth:`~plasmid.protocols.RolloutEngine.response_logprobs` (plugin API 1.1): an ``engine``
    with a callable ``score`` and no ``response_logprobs`` gets ``response_logprobs`` (its own
    ``score``, bound) on the instance, with a :class:`DeprecationWarning` naming ``label``, so
    callers and ``isinstance(engine, RolloutEngine)`` see the new name. Returns ``engine``; one
    that cannot take attributes is left as it is. Removed with plugin API 2."""
    score = getattr(engine, "score", None)
    if hasattr(engine, "response_logprobs") or not callable(score):
        return engine
    warnings.warn(f"{label}: RolloutEngine.score is deprecated; name the method response_logprobs "
                  f"(keep score = response_logprobs as an alias for your own callers)", DeprecationWarning,
                  stacklevel=2)
    try:
        engine.response_logprobs = score
    except AttributeError:
        pass
    return engine


def lock_registry(config: Config) -> Registry:
    """Load exactly ``config.plugin_lock`` in this process and collect its providers.

    :raises PluginError: a plugin of the lock is not installed here, or in another version.
    """
    manager = PluginManager()
    manager.load_lock(config.plugin_lock)
    return Registry.collect(manager)


def find(family: str, name: str, config: Config, *, registry: Registry | None = None,
         flag: str | None = None) -> Provider:
    """The provider ``name`` of ``family`` (``"loss"``, ``"engine"``, ...) in ``registry``
    (default: :func:`lock_registry` of ``config``), not built yet.

    :param flag: the option that named it, for the error (default: the family's own, ``--loss``).
    :raises PluginError: no such provider (with a "did you mean" and what is available).
    """
    return (registry if registry is not None else lock_registry(config)).get(family, name, flag=flag)


def build(family: str, name: str, config: Config, *args: Any, registry: Registry | None = None,
          flag: str | None = None) -> Any:
    """The provider ``name`` of ``family`` (:func:`find`), built as ``factory(config, *args)``
    (a trainer's factory also takes the loss: ``build("trainer", name, config, loss)``).

    :raises PluginError: no such provider.
    :raises ProviderError: its factory failed (naming the provider and its plugin).
    """
    return instantiate(find(family, name, config, registry=registry, flag=flag), config, *args)
