"""Named providers per family, collected from the registration hooks, and choosing among them.

The registry owns the rules: names are unique per family (two plugins registering one name is
an error naming both), a lazy ``"module:attr"`` factory is imported only when chosen, and a
one-provider family resolves to the flag's choice, the single candidate, or the one default.
"""

from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass
from typing import Any

from plasmid.errors import PluginError
from plasmid.families import BY_NAME, FAMILIES, Family
from plasmid.plugins import PluginInfo, PluginManager, did_you_mean

#: ``register(..., kind=K)`` in ``plasmid_generators`` before generate functions had their own
#: hook: the family K stands for. Deprecated; kept so that plugins written for it keep working.
LEGACY_GENERATOR_KINDS = {"engine": "engine", "generate": "generate"}


@dataclass
class Provider:
    """One registered provider: its factory (or lazy ``"module:attr"``) and who gave it."""

    family: str
    name: str
    factory: Any
    plugin: PluginInfo
    default: bool = False

    def load(self) -> Any:
        """The factory, importing a lazy ``"module:attr"`` now; import errors name the plugin."""
        if not isinstance(self.factory, str):
            return self.factory
        module_name, _, attr = self.factory.partition(":")
        try:
            obj = importlib.import_module(module_name)
            for part in attr.split(".") if attr else []:
                obj = getattr(obj, part)
        except Exception as exc:
            raise PluginError(
                f"{self.family} '{self.name}' from plugin {self.plugin.label} could not be loaded from "
                f"'{self.factory}': {type(exc).__name__}: {exc}. Install its dependencies "
                f"(pip install --force-reinstall {self.plugin.distribution}) or choose another {self.family}"
            ) from exc
        self.factory = obj
        return obj

    def describe(self) -> str:
        return f"'{self.name}' from {self.plugin.label}"


class Registry:
    """Providers by family and name."""

    def __init__(self) -> None:
        self.providers: dict[str, dict[str, Provider]] = {family.name: {} for family in FAMILIES}

    @classmethod
    def collect(cls, manager: PluginManager, *, tolerant: bool = False) -> Registry:
        """Call every registration hook of every loaded plugin and gather what they register.

        ``tolerant`` (for listing plugins): a plugin whose registration fails is marked
        ``invalid`` with the reason instead of stopping the collection.
        """
        registry = cls()
        for family in FAMILIES:
            for info, impl in manager.registration_impls(family.hook):
                if info.status == "invalid":
                    continue
                register = registry._register_function(family, info)
                try:
                    impl.function(**{arg: register for arg in impl.argnames})
                except PluginError as exc:
                    if not tolerant:
                        raise
                    info.status, info.reason = "invalid", str(exc)
                except Exception as exc:  # a broken hook names its plugin
                    problem = f"plugin {info.label} failed in {family.hook}: {type(exc).__name__}: {exc}"
                    if not tolerant:
                        raise PluginError(problem) from exc
                    info.status, info.reason = "invalid", problem
        return registry

    def _register_function(self, family: Family, info: PluginInfo) -> Any:
        """The ``register(name, factory, *, default=False)`` handed to ``info``'s ``family.hook``."""

        def register(name: str, factory: Any, *, default: bool = False, kind: str | None = None) -> None:
            target = family
            if kind is not None:
                if family.name != "engine" or kind not in LEGACY_GENERATOR_KINDS:
                    raise PluginError(f"plugin {info.label} registered '{name}' with kind={kind!r}; "
                                      f"{family.hook} takes no kind")
                target = BY_NAME[LEGACY_GENERATOR_KINDS[kind]]
                if target.name == "generate":
                    warnings.warn(f"plugin {info.label}: register(..., kind='generate') in plasmid_generators is "
                                  f"deprecated; register generate functions in plasmid_generate_fns",
                                  DeprecationWarning, stacklevel=2)
            self.add(Provider(target.name, name, factory, info, default))

        return register

    def add(self, provider: Provider) -> None:
        family = self.providers[provider.family]
        if not isinstance(provider.name, str) or not provider.name:
            raise PluginError(f"plugin {provider.plugin.label} registered a {provider.family} without a name")
        if provider.name in family:
            other = family[provider.name]
            raise PluginError(
                f"{provider.family} '{provider.name}' is registered by two plugins: {other.plugin.label} and "
                f"{provider.plugin.label}; deselect one with --plugins no:NAME"
            )
        family[provider.name] = provider
        provider.plugin.providers.setdefault(provider.family, []).append(provider.name)

    def names(self, family: str) -> list[str]:
        return sorted(self.providers[family])

    def get(self, family: str, name: str) -> Provider:
        """The provider ``name`` of ``family``, or an error with a "did you mean"."""
        candidates = self.providers[family]
        if name not in candidates:
            listing = ", ".join(p.describe() for p in candidates.values()) or "none is loaded"
            raise PluginError(
                f"unknown {family} '{name}' ({BY_NAME[family].flag}){did_you_mean(name, candidates)}; "
                f"available: {listing}"
            )
        return candidates[name]

    def choose(self, family: str, name: str | None) -> Provider:
        """The one provider of a one-provider family: ``name`` if given, else the single
        candidate, else the single default; anything else is an error listing the candidates."""
        if name:
            return self.get(family, name)
        candidates = list(self.providers[family].values())
        flag = BY_NAME[family].flag
        if len(candidates) == 1:
            return candidates[0]
        if not candidates:
            hint = BY_NAME[family].missing_hint
            raise PluginError(
                f"no {family} is loaded: " + (hint or "install a plugin that provides one, or check --plugins "
                                              "('plasmid plugins' lists what is installed)")
            )
        defaults = [p for p in candidates if p.default]
        if len(defaults) == 1:
            return defaults[0]
        listing = "; ".join(p.describe() for p in sorted(candidates, key=lambda p: p.name))
        raise PluginError(f"{len(candidates)} {family} providers are loaded and none was chosen: {listing}. "
                          f"Choose one with {flag} NAME")
