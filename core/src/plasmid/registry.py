"""Named providers per family, collected from the registration hooks, and choosing among them.

The registry owns the rules: names are unique per family (two plugins registering one name is
an error naming both), a lazy ``"module:attr"`` factory is imported only when chosen, and a
one-provider family resolves to the flag's choice, the single candidate, or the one default.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from plasmid.errors import PluginError
from plasmid.plugins import PluginInfo, PluginManager, did_you_mean

#: registration hook -> family names it feeds (generators feed two, told apart by ``kind``).
HOOK_FAMILIES: dict[str, tuple[str, ...]] = {
    "plasmid_datasources": ("datasource",),
    "plasmid_generators": ("engine", "generate"),
    "plasmid_rollouts": ("rollout",),
    "plasmid_rewards": ("reward",),
    "plasmid_filters": ("filter",),
    "plasmid_losses": ("loss",),
    "plasmid_trainers": ("trainer",),
    "plasmid_weight_syncs": ("weight_sync",),
    "plasmid_runtimes": ("runtime",),
}

#: family -> the command-line flag that chooses it.
FAMILY_FLAGS: dict[str, str] = {
    "datasource": "--datasource",
    "engine": "--engine",
    "generate": "--generate",
    "rollout": "--rollout",
    "reward": "--reward",
    "filter": "--filter",
    "loss": "--loss",
    "trainer": "--trainer",
    "weight_sync": "--weight-sync",
    "runtime": "--runtime",
}


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
        except Exception as exc:  # noqa: BLE001
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
        self.providers: dict[str, dict[str, Provider]] = {f: {} for fams in HOOK_FAMILIES.values() for f in fams}

    @classmethod
    def collect(cls, manager: PluginManager, *, tolerant: bool = False) -> Registry:
        """Call every registration hook of every loaded plugin and gather what they register.

        ``tolerant`` (for listing plugins): a plugin whose registration fails is marked
        ``invalid`` with the reason instead of stopping the collection.
        """
        registry = cls()
        for hook_name, families in HOOK_FAMILIES.items():
            for info, impl in manager.registration_impls(hook_name):
                if info.status == "invalid":
                    continue

                def register(name: str, factory: Any, *, kind: str = families[0], default: bool = False,
                             _info: PluginInfo = info, _families: tuple[str, ...] = families) -> None:
                    if kind not in _families:
                        raise PluginError(
                            f"plugin {_info.label} registered '{name}' with kind={kind!r}; expected one of {_families}"
                        )
                    registry.add(Provider(kind, name, factory, _info, default))

                try:
                    impl.function(**{arg: register for arg in impl.argnames})
                except PluginError as exc:
                    if not tolerant:
                        raise
                    info.status, info.reason = "invalid", str(exc)
                except Exception as exc:  # noqa: BLE001 - a broken hook names its plugin
                    problem = f"plugin {info.label} failed in {hook_name}: {type(exc).__name__}: {exc}"
                    if not tolerant:
                        raise PluginError(problem) from exc
                    info.status, info.reason = "invalid", problem
        return registry

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
                f"unknown {family} '{name}' ({FAMILY_FLAGS[family]}){did_you_mean(name, candidates)}; "
                f"available: {listing}"
            )
        return candidates[name]

    def choose(self, family: str, name: str | None) -> Provider:
        """The one provider of a one-provider family: ``name`` if given, else the single
        candidate, else the single default; anything else is an error listing the candidates."""
        if name:
            return self.get(family, name)
        candidates = list(self.providers[family].values())
        flag = FAMILY_FLAGS[family]
        if len(candidates) == 1:
            return candidates[0]
        if not candidates:
            raise PluginError(
                f"no {family} is loaded: install a plugin that provides one, or check --plugins "
                f"('plasmid plugins' lists what is installed)"
            )
        defaults = [p for p in candidates if p.default]
        if len(defaults) == 1:
            return defaults[0]
        listing = "; ".join(p.describe() for p in sorted(candidates, key=lambda p: p.name))
        raise PluginError(f"{len(candidates)} {family} providers are loaded and none was chosen: {listing}. "
                          f"Choose one with {flag} NAME")
