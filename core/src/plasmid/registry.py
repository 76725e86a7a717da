"""Named providers per family, collected from the registration hooks, and choosing among them.

The registry owns the rules: names are unique per family, a lazy ``"module:attr"`` factory is
imported only when chosen, and a one-provider family resolves to the flag's choice, the single
candidate, or the one default.

Broken registrations follow the policy of :mod:`plasmid.plugins`: a name another plugin
registered first (plugins register in the order the kernel's, first-party, the rest), a lazy
target whose module cannot be found (checked without importing it), or a registration hook
that raises are errors naming the plugin when it was selected, and are skipped with a one-line
warning when it was auto-loaded; for the first two only that provider is skipped.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import warnings
from dataclasses import dataclass
from typing import Any

from plasmid.errors import PluginError, did_you_mean
from plasmid.families import BY_NAME, FAMILIES, Family
from plasmid.plugins import LOCAL_DISTRIBUTION, PluginInfo, PluginManager

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


def missing_target(target: str) -> str:
    """Why the lazy factory ``"module:attr"`` cannot resolve, found without importing anything:
    its module (or a package above it) cannot be found, or, when the module is imported already,
    it lacks the attribute. ``""`` when nothing is known to be wrong (only importing it tells)."""
    module_name, _, attr = target.partition(":")
    if not module_name:
        return f"'{target}' is not of the form 'module:attr'"
    module = sys.modules.get(module_name)
    if module is None:
        return _unfindable(module_name)
    obj: Any = module
    for part in attr.split(".") if attr else []:
        if not hasattr(obj, part):
            return f"module {module_name} has no attribute '{attr}'"
        obj = getattr(obj, part)
    return ""


def _unfindable(module_name: str) -> str:
    """``"no module named X"`` when ``module_name`` cannot be found, without executing any of its
    packages (a package not yet imported is searched by path)."""
    parts = module_name.split(".")
    locations: list[str] | None = None
    for depth in range(1, len(parts) + 1):
        prefix = ".".join(parts[:depth])
        module = sys.modules.get(prefix)
        if module is not None:
            found = getattr(module, "__path__", None)
        else:
            try:
                if depth == 1:
                    spec = importlib.util.find_spec(prefix)
                elif locations is None:
                    spec = None
                else:
                    spec = importlib.machinery.PathFinder.find_spec(prefix, locations)
            except (ImportError, ValueError):
                spec = None
            if spec is None:
                return f"no module named '{prefix}'"
            found = spec.submodule_search_locations
        locations = list(found) if found is not None else None
    return ""


def _deselect(info: PluginInfo) -> str:
    if info.distribution == LOCAL_DISTRIBUTION:
        return f"drop {info.target} from --plugins"
    return f"--plugins no:{info.name}"


class Registry:
    """Providers by family and name.

    :ivar skipped: family -> provider name -> why it was skipped at start-up (the message
        :meth:`get` gives when that name is asked for).
    """

    def __init__(self) -> None:
        self.providers: dict[str, dict[str, Provider]] = {family.name: {} for family in FAMILIES}
        self.skipped: dict[str, dict[str, str]] = {family.name: {} for family in FAMILIES}
        self.manager: PluginManager | None = None

    @classmethod
    def collect(cls, manager: PluginManager, *, tolerant: bool = False) -> Registry:
        """Call every registration hook of every loaded plugin and gather what they register.

        Plugins register in :attr:`PluginInfo.rank` order (the kernel's, first-party, the rest),
        so the provider that keeps a contested name does not depend on entry-point names.
        Broken registrations follow the policy of :mod:`plasmid.plugins`. ``tolerant`` (for
        listing plugins): every broken registration is recorded (``skipped`` plugin, or a line of
        ``PluginInfo.problems``) instead of stopping the collection.
        """
        registry = cls()
        registry.manager = manager
        was_tolerant = manager.tolerant
        manager.tolerant = was_tolerant or tolerant
        try:
            for family in FAMILIES:
                impls = sorted(manager.registration_impls(family.hook), key=lambda pair: pair[0].rank)
                for info, impl in impls:
                    if info.status == "skipped":
                        continue
                    registry._call(manager, family, info, impl)
        finally:
            manager.tolerant = was_tolerant
        return registry

    def _call(self, manager: PluginManager, family: Family, info: PluginInfo, impl: Any) -> None:
        """Call one registration hook; one that raises drops every provider of its plugin and
        the plugin (auto-loaded), or stops the start-up (selected)."""
        register = self._register_function(family, info)
        try:
            impl.function(**{arg: register for arg in impl.argnames})
        except Exception as exc:  # a broken hook names its plugin
            if not (info.tolerated or manager.tolerant):
                if isinstance(exc, PluginError):
                    raise
                raise PluginError(f"plugin {info.label} failed in {family.hook}: {type(exc).__name__}: "
                                  f"{exc}; {info.code_fix}") from exc
            self.drop(info)
            problem = str(exc) if isinstance(exc, PluginError) else f"{type(exc).__name__}: {exc}"
            manager.reject(info, f"failed in {family.hook}: {problem}", fix=info.code_fix, error=exc)

    def drop(self, info: PluginInfo) -> None:
        """Remove every provider that ``info`` registered."""
        for providers in self.providers.values():
            for name in [name for name, provider in providers.items() if provider.plugin is info]:
                del providers[name]
        info.providers.clear()

    def prune(self) -> bool:
        """Drop the providers of plugins skipped after they registered (a bootstrap hook failed),
        remembering why for :meth:`get`; whether any was dropped."""
        pruned = [p for family in self.providers.values() for p in family.values() if p.plugin.status == "skipped"]
        for p in pruned:
            del self.providers[p.family][p.name]
            self.skipped[p.family][p.name] = f"plugin {p.plugin.label} {p.plugin.reason}"
        return bool(pruned)

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
        """Add ``provider``. A name already taken in its family, or a lazy target whose module
        cannot be found (checked for plugins loaded from entry points or ``--plugins``), is an
        error, or, for an auto-loaded plugin, skips this provider with a warning (the provider
        registered first keeps the name)."""
        family = self.providers[provider.family]
        plugin = provider.plugin
        if not isinstance(provider.name, str) or not provider.name:
            raise PluginError(f"plugin {plugin.label} registered a {provider.family} without a name")
        what = f"{provider.family} '{provider.name}'"
        if provider.name in family:
            other = family[provider.name]
            problem = f"{what} is registered by two plugins: {other.plugin.label} and {plugin.label}"
            if self.manager is None or not (plugin.tolerated or plugin.origin == "lock" or self.manager.tolerant):
                raise PluginError(f"{problem}; deselect one of them ({_deselect(other.plugin)} or "
                                  f"{_deselect(plugin)})")
            self.manager.reject_provider(
                plugin, what, f"the name is taken: {other.plugin.label} registered it first",
                f"to use this one, deselect the other ({_deselect(other.plugin)})")
            return
        if isinstance(provider.factory, str) and plugin.origin and self.manager is not None:
            missing = missing_target(provider.factory)
            if missing:
                problem = f"points to '{provider.factory}': {missing}"
                self.skipped[provider.family][provider.name] = f"plugin {plugin.label} {problem}; {plugin.fix}"
                self.manager.reject_provider(plugin, what, problem, plugin.fix)
                return
        family[provider.name] = provider
        provider.plugin.providers.setdefault(provider.family, []).append(provider.name)

    def names(self, family: str) -> list[str]:
        return sorted(self.providers[family])

    def get(self, family: str, name: str, flag: str | None = None) -> Provider:
        """The provider ``name`` of ``family``, or an error with a "did you mean" naming ``flag``
        (default: the family's own, ``--engine`` ...; a plugin's option that names a provider of
        the family, as ``--teacher-engine``, passes its own)."""
        candidates = self.providers[family]
        flag = flag or BY_NAME[family].flag
        if name not in candidates and name in self.skipped[family]:
            raise PluginError(f"{family} '{name}' ({flag}) was skipped at start-up: {self.skipped[family][name]}")
        if name not in candidates:
            listing = ", ".join(p.describe() for p in candidates.values()) or "none is loaded"
            raise PluginError(f"unknown {family} '{name}' ({flag}){did_you_mean(name, candidates)}; "
                              f"available: {listing}")
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
