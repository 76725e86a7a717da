"""Finding, selecting, checking and loading plugins; the plugin lock.

A plugin is a module (or object) listed under the entry-point group ``plasmid``, or a local
module named with ``--plugins ./file.py`` / ``--plugins pkg.module``. The selection grammar
(flag ``--plugins`` or env ``PLASMID_PLUGINS``; the flag wins) is a comma-separated list:

- unset: every installed plugin;
- ``a,b``: exactly ``a`` and ``b`` (plus the kernel's own); an empty value: none;
- ``no:a``: exclude ``a`` (with no plain names: every installed plugin but ``a``);
- ``./path.py`` or ``pkg.module``: add a local module as a plugin.

Filtering happens before import.

One policy covers every broken plugin: one that fails to import, whose declared ``plasmid``
requirement excludes this kernel, whose hook implementation takes an argument its hookspec
does not declare, that implements a hook plasmid does not define (a misspelled name), whose
registration or bootstrap hook raises (what a failing addoption, defaults or configure hook declared
or set is undone; a :class:`PlasmidError` of the last two is the user's error, not the plugin's),
that registers a lazy ``"module:attr"`` target whose module does not exist, or that registers a
provider name another plugin of the family registered first.

- An *auto-loaded* plugin (not named in ``--plugins``) is skipped with a one-line warning on
  stderr, ``plasmid: warning: skipping plugin 'NAME' (distribution DIST VERSION): PROBLEM; FIX``,
  and the run goes on. A provider-level problem (collision, missing lazy target) skips only that
  provider; the plugin's other providers and hooks stay.
- A *selected* plugin (named in ``--plugins``, a local module, or registered directly by
  :func:`plasmid.testing.make_manager`) stops the start-up with a :class:`PluginError` carrying
  the same text (``plasmid: error: plugin 'NAME' (...) PROBLEM; FIX``, exit 2).
- A plugin loaded from a plugin lock (another process of the same run) must load as in the
  driver: a plugin-level problem is an error; a provider-level one is resolved as the driver
  resolved it, silently (the driver warned already).

Provider names: in a collision the provider registered first keeps the name. Registration runs
in a fixed order: the kernel's own plugins, then *first-party* plugins, then every other plugin,
each group in entry-point name order (local modules last). A first-party plugin is one whose
distribution is in :data:`FIRST_PARTY`, the kernel's own list of this repository's distributions
(a ``plasmid-`` prefix alone grants nothing), so a third-party reward named ``exact`` never
displaces plasmid-match's.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata as metadata
import importlib.util
import inspect
import re
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pluggy

import plasmid
from plasmid import hookspecs
from plasmid.errors import PlasmidError, PluginError
from plasmid.errors import did_you_mean as did_you_mean  # re-exported: plugins import it from here

if TYPE_CHECKING:
    from plasmid.config import Config, OptionParser

ENTRY_POINT_GROUP = "plasmid"
ENV_VAR = "PLASMID_PLUGINS"
LOCAL_DISTRIBUTION = "(local)"
KERNEL_PLUGINS = ("plasmid.kernel_options", "plasmid.builtin")
#: This repository's distributions (core, plugins/*/*, libs/*; a test keeps it in step with their pyprojects).
FIRST_PARTY = frozenset(("plasmid " + " ".join(f"plasmid-{name}" for name in (
    "agent code dynamic gguf grpo gym hf hf-datasets jsonl match math megatron mlflow multiturn opd parity ppo ray "
    "reasoning-gym reinforce-pp remote rollout scaffold serving sft sglang sync tasks tensorboard tools torch torchgen "
    "torchtrain verifiers vllm wandb").split())).split())


@dataclass
class PluginInfo:
    """What the kernel knows of one plugin.

    :ivar status: ``loaded``, ``skipped`` (broken or incompatible: auto-loaded, or listed
        tolerantly), ``excluded`` (deselected; never imported) or ``kernel``.
    :ivar reason: why it is skipped or excluded: the problem and its fix.
    :ivar providers: family -> provider names it registered (filled by the registry).
    :ivar origin: how it came to be loaded, which decides what a problem does (see the module
        docstring): ``autoload``, ``selection`` (``--plugins``), ``lock`` (another process of
        the run) or ``""`` (the kernel's own, or registered directly: problems are errors).
    :ivar problems: provider-level problems (a skipped colliding provider, a missing lazy
        target), one line each; the plugin itself stays loaded.
    """

    name: str
    distribution: str
    version: str
    target: str
    status: str = "not loaded"
    reason: str = ""
    import_seconds: float = 0.0
    hooks: list[str] = field(default_factory=list)
    providers: dict[str, list[str]] = field(default_factory=dict)
    origin: str = ""
    problems: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        """``name (distribution version)`` for messages."""
        if self.distribution == LOCAL_DISTRIBUTION:
            return f"'{self.name}' (local module {self.target})"
        return f"'{self.name}' (distribution {self.distribution} {self.version})"

    @property
    def fix(self) -> str:
        """How the user gets rid of a problem of this plugin, for messages."""
        if self.distribution == LOCAL_DISTRIBUTION:
            return f"fix the module or drop {self.target} from --plugins"
        if self.origin in ("autoload", "selection", "lock"):
            return (f"reinstall it (pip install --force-reinstall {self.distribution}) or deselect it "
                    f"(--plugins no:{self.name})")
        return "fix the plugin"

    @property
    def code_fix(self) -> str:
        """:attr:`fix` for a fault of the plugin's own code, which reinstalling cannot mend."""
        return self.fix if self.distribution == LOCAL_DISTRIBUTION or not self.origin else (
            f"report it to the authors of {self.distribution}, or deselect it (--plugins no:{self.name})")

    @property
    def tolerated(self) -> bool:
        """Whether a problem of this plugin skips it (auto-loaded) rather than stopping the
        start-up. A plugin of a lock must load as it did in the driver: its problems are errors,
        but for provider-level ones, which the driver resolved the same way."""
        return self.origin == "autoload"

    @property
    def rank(self) -> int:
        """Registration order group: 0 the kernel's own, 1 first-party, 2 the rest."""
        if self.status == "kernel":
            return 0
        return 1 if is_first_party(self.distribution) else 2

    def lock_entry(self) -> dict[str, str]:
        return {"name": self.name, "distribution": self.distribution, "version": self.version, "target": self.target}


@dataclass
class Selection:
    """A parsed ``--plugins`` value."""

    autoload: bool = True
    include: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)
    local: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, spec: str | None, installed: Iterable[str] = ()) -> Selection:
        """Parse the grammar in the module docstring; ``None`` means unset (load everything)."""
        if spec is None:
            return cls()
        selection = cls(autoload=False)
        names = set(installed)
        excludes_only = True
        for item in (part.strip() for part in spec.split(",")):
            if not item:
                continue
            if item.startswith("no:"):
                selection.exclude.append(item[3:])
            elif item in names:
                selection.include.append(item)
                excludes_only = False
            elif "/" in item or item.endswith(".py") or "." in item:
                selection.local.append(item)
            else:
                selection.include.append(item)
                excludes_only = False
        if excludes_only and spec.strip():
            selection.autoload = True  # only no: and local items: everything else stays on
        return selection

    @classmethod
    def from_env_or_flag(cls, flag: str | None, installed: Iterable[str], environ: dict[str, str]) -> Selection:
        spec = flag if flag is not None else environ.get(ENV_VAR)
        return cls.parse(spec, installed)


def installed_entry_points(shadowed: list[str] | None = None) -> dict[str, metadata.EntryPoint]:
    """Entry points of group ``plasmid``, by name, de-duplicated (editable installs show twice).

    Two *different* targets under one name follow the collision rule of providers: a first-party
    distribution's keeps the name over a third party's, otherwise the first found keeps it; the
    other is not loaded, and one line saying so (naming both distributions and the fix) is
    appended to ``shadowed`` for the caller to warn with.
    """
    found: dict[str, metadata.EntryPoint] = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        seen = found.get(ep.name)
        if seen is None:
            found[ep.name] = ep
            continue
        if seen.value == ep.value:
            continue
        keeper, loser = seen, ep
        if is_first_party(_dist_name(ep)) and not is_first_party(_dist_name(seen)):
            keeper, loser = ep, seen
        found[ep.name] = keeper
        if shadowed is not None:
            shadowed.append(
                f"skipping plugin '{ep.name}' of distribution {_dist_name(loser)} {_dist_version(loser)} "
                f"({loser.value}): distribution {_dist_name(keeper)} {_dist_version(keeper)} already provides a "
                f"plugin of that name ({keeper.value}), which is loaded instead; uninstall one of them, or rename "
                f"the entry point of {_dist_name(loser)}")
    return found


def is_first_party(distribution: str) -> bool:
    """Whether ``distribution`` is in :data:`FIRST_PARTY` (compared normalized, so ``plasmid_grpo``
    counts); a third party's ``plasmid-mine`` does not."""
    return distribution.lower().replace("_", "-").replace(".", "-") in FIRST_PARTY


def _dist_name(ep: metadata.EntryPoint) -> str:
    return ep.dist.name if ep.dist is not None else "?"


def _dist_version(ep: metadata.EntryPoint) -> str:
    return ep.dist.version if ep.dist is not None else ""


def hook_signature(name: str) -> str:
    """``plasmid_metrics(step: int, metrics: dict[str, float])``: hook ``name`` as its hookspec declares it."""
    parameters = inspect.signature(getattr(hookspecs, name)).parameters.values()
    return f"{name}({', '.join(f'{p.name}: {p.annotation}' for p in parameters)})"


def kernel_incompatibility(dist: metadata.Distribution | None) -> str:
    """Why ``dist``'s declared ``plasmid`` requirement excludes this kernel, or ``""``.

    Read from metadata, before anything is imported.
    """
    if dist is None:
        return ""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    for line in dist.requires or []:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(requirement.name) != "plasmid":
            continue
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        if not requirement.specifier.contains(plasmid.__version__, prereleases=True):
            return (
                f"requires plasmid{requirement.specifier} but plasmid {plasmid.__version__} is installed; "
                f"install a version of {dist.name} built for plasmid {plasmid.__version__}, "
                f"or install a matching kernel (pip install 'plasmid{requirement.specifier}')"
            )
    return ""


class PluginManager:
    """The kernel's facade over pluggy: loads plugins and calls hooks by name.

    The rest of the kernel never writes ``pm.hook.<name>``; it calls a method here.
    """

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager("plasmid")
        self.pm.add_hookspecs(hookspecs)
        self.infos: dict[str, PluginInfo] = {}
        self.tolerant = False
        #: the warnings given so far, each once (see :meth:`warn`)
        self.warnings: list[str] = []
        #: ``--observer-errors``, the plugins whose observers are off, the first failure (:meth:`observe`)
        self.observer_errors, self.switched_off, self.observer_failure = "warn", set[str](), ""

    # ---------------------------------------------------------------------------- the policy
    def warn(self, message: str) -> None:
        """Print ``plasmid: warning: MESSAGE`` on stderr, one line, once per manager; recorded in
        :attr:`warnings`. Nothing is printed while listing (``tolerant``)."""
        message = " ".join(message.split())
        if message in self.warnings:
            return
        self.warnings.append(message)
        if not self.tolerant:
            print(f"plasmid: warning: {message}", file=sys.stderr, flush=True)

    def reject(self, info: PluginInfo, problem: str, *, fix: str = "", error: BaseException | None = None) -> None:
        """Apply the policy (module docstring) to a broken plugin: raise a :class:`PluginError`
        for a selected one; otherwise unregister it, mark it ``skipped`` and warn (auto-loaded)."""
        fix, problem = fix or info.fix, " ".join(problem.split())
        if not (info.tolerated or self.tolerant):
            raise PluginError(f"plugin {info.label} {problem}; {fix}") from error
        if info.status == "loaded":
            self.pm.unregister(name=info.name)
        info.status, info.reason = "skipped", f"{problem}; {fix}"
        self.infos[info.name] = info
        if info.origin == "autoload":
            self.warn(f"skipping plugin {info.label}: {problem}; {fix}")

    def reject_provider(self, info: PluginInfo, what: str, problem: str, fix: str) -> None:
        """The policy for one provider ``what`` (``reward 'exact'``) of ``info``: an error for a
        selected plugin; otherwise the provider alone is skipped (recorded in ``info.problems``)
        with a warning (auto-loaded), and the plugin's other providers stay."""
        problem = " ".join(problem.split())
        if not (info.tolerated or info.origin == "lock" or self.tolerant):
            raise PluginError(f"{what} of plugin {info.label}: {problem}; {fix}")
        info.problems.append(f"{what} skipped: {problem}; {fix}")
        if info.origin == "autoload":
            self.warn(f"skipping {what} of plugin {info.label}: {problem}; {fix}")

    # ---------------------------------------------------------------------------- loading
    def load_kernel_plugins(self) -> None:
        for module_name in KERNEL_PLUGINS:
            module = importlib.import_module(module_name)
            info = PluginInfo(module_name, "plasmid", plasmid.__version__, module_name, status="kernel")
            self._register(module, info)

    def load(self, selection: Selection, *, tolerant: bool = False) -> None:
        """Load the kernel's plugins and those ``selection`` picks, then validate hooks.

        Broken plugins follow the policy of the module docstring. ``tolerant`` (for listing
        plugins): every broken plugin, selected or not, is recorded as ``skipped`` with its
        reason, without a warning, instead of stopping the load.
        """
        self.tolerant = tolerant
        self.load_kernel_plugins()
        shadowed: list[str] = []
        installed = installed_entry_points(shadowed)
        for message in shadowed:
            self.warn(message)
        known = list(installed)
        for name in [*selection.include, *selection.exclude]:
            if name not in installed:
                raise PluginError(
                    f"unknown plugin '{name}' in --plugins/{ENV_VAR}{did_you_mean(name, known)} "
                    f"(installed: {', '.join(sorted(known)) or 'none'}; run 'plasmid plugins' to list them)"
                )
        ordered = sorted(installed.items(), key=lambda item: (not is_first_party(_dist_name(item[1])), item[0]))
        for name, ep in ordered:
            info = PluginInfo(name, _dist_name(ep), _dist_version(ep), ep.value)
            self.infos[name] = info
            chosen = name in selection.include
            if name in selection.exclude or not (chosen or selection.autoload):
                info.status, info.reason = "excluded", "not selected by --plugins"
                continue
            info.origin = "selection" if chosen else "autoload"
            self._load_entry_point(ep, info)
        for target in selection.local:
            self.load_local(target)
        self.check()

    def _load_entry_point(self, ep: metadata.EntryPoint, info: PluginInfo) -> None:
        problem = kernel_incompatibility(ep.dist)
        if problem:
            self.reject(info, problem, fix=f"or deselect it (--plugins no:{info.name})")
            return
        started = time.perf_counter()
        try:
            obj = ep.load()
        except Exception as exc:  # noqa: BLE001 - any import failure is reported, named
            info.import_seconds = time.perf_counter() - started
            self.reject(info, f"failed to import {ep.value}: {type(exc).__name__}: {exc}", error=exc)
            return
        info.import_seconds = time.perf_counter() - started
        self._register(obj, info)

    def load_local(self, target: str) -> PluginInfo:
        """Load ``./file.py`` or ``pkg.module`` as a plugin named after the file or module."""
        path = Path(target)
        try:
            if target.endswith(".py") or "/" in target:
                if not path.is_file():
                    raise PluginError(f"local plugin file {target} does not exist")
                name = path.stem
                spec = importlib.util.spec_from_file_location(f"plasmid_local_{name}", path)
                assert spec is not None and spec.loader is not None
                module = importlib.util.module_from_spec(spec)
                sys.modules[spec.name] = module
                spec.loader.exec_module(module)
                target = str(path.resolve())
            else:
                name = target
                module = importlib.import_module(target)
        except PluginError:
            raise
        except Exception as exc:
            raise PluginError(f"local plugin {target} failed to import: {type(exc).__name__}: {exc}") from exc
        info = PluginInfo(name, LOCAL_DISTRIBUTION, "", target, origin="selection")
        self.infos[name] = info
        self._register(module, info)
        return info

    def _register(self, obj: Any, info: PluginInfo) -> None:
        """Register ``obj`` under ``info.name``; a hook implementation whose arguments its
        hookspec does not declare (or a name taken twice) follows the policy."""
        try:
            self.pm.register(obj, name=info.name)
        except (pluggy.PluginValidationError, ValueError) as exc:
            if info.status == "kernel":
                raise
            found = re.search(r"for hook '(\w+)'\nhookimpl definition: (.*)\nArgument\(s\) \{(.*)\}", str(exc))
            problem = (f"{found[2]} takes {found[3]}, which the hook does not pass; the hook is "
                       f"{hook_signature(found[1])}") if found else str(exc)
            self.reject(info, f"has an invalid hook implementation: {problem}", fix=info.code_fix, error=exc)
            return
        info.status = info.status if info.status == "kernel" else "loaded"
        info.hooks = sorted(impl_name for impl_name in dir(obj) if impl_name.startswith("plasmid_"))
        self.infos[info.name] = info

    def check(self) -> None:
        """Apply the policy to plugins whose hook implementations match no hookspec (a
        misspelled hook name): a selected one is an error, an auto-loaded one is skipped."""
        while True:
            try:
                self.pm.check_pending()
                return
            except pluggy.PluginValidationError as exc:
                plugin = self._owner(exc.plugin)
                name = (re.findall(r"unknown hook '(\w+)'", str(exc)) or ["?"])[0]
                meant = difflib.get_close_matches(name, [h for h in dir(hookspecs) if h.startswith("plasmid_")], 1)
                problem = f"implements {name}, a hook plasmid does not define" + "".join(
                    f"; did you mean {hook}? It is {hook_signature(hook)}" for hook in meant)
                if plugin is None:
                    raise PluginError(f"plugin {exc.plugin!r} {problem}") from exc
                self.reject(plugin, problem, fix=plugin.code_fix, error=exc)

    def _owner(self, obj: Any) -> PluginInfo | None:
        name = self.pm.get_name(obj)
        return self.infos.get(name) if name else None

    # ---------------------------------------------------------------------------- lock
    def lock(self) -> list[dict[str, str]]:
        """The loaded set: ``[{name, distribution, version, target}]``, kernel first."""
        entries = [{"name": "plasmid", "distribution": "plasmid", "version": plasmid.__version__, "target": "plasmid"}]
        entries += [info.lock_entry() for info in self.infos.values() if info.status == "loaded"]
        return entries

    def load_lock(self, lock: list[dict[str, str]]) -> None:
        """Load exactly the plugins of ``lock`` (from another process); fail on any version drift."""
        self.load_kernel_plugins()
        installed = installed_entry_points()
        for entry in lock:
            name, dist, version = entry["name"], entry["distribution"], entry["version"]
            if name == "plasmid":
                if version != plasmid.__version__:
                    raise PluginError(
                        f"the driver runs plasmid {version} but this process has plasmid {plasmid.__version__}; "
                        f"install the same version (pip install plasmid=={version})"
                    )
                continue
            if dist == LOCAL_DISTRIBUTION:
                self.load_local(entry["target"])
                continue
            ep = installed.get(name)
            if ep is None:
                raise PluginError(
                    f"plugin '{name}' ({dist} {version}) is in the plugin lock but not installed in this process; "
                    f"install it (pip install {dist}=={version})"
                )
            info = PluginInfo(name, _dist_name(ep), _dist_version(ep), ep.value, origin="lock")
            if (info.distribution, info.version) != (dist, version):
                raise PluginError(
                    f"plugin '{name}': the driver has {dist} {version} but this process has "
                    f"{info.distribution} {info.version}; install the same version (pip install {dist}=={version})"
                )
            self._load_entry_point(ep, info)
        self.check()

    # ---------------------------------------------------------------------------- hook facade
    def addoption(self, parser: OptionParser) -> None:
        self._bootstrap("plasmid_addoption", parser=parser)

    def defaults(self, config: Config) -> None:
        self._bootstrap("plasmid_defaults", config=config)

    def configure(self, config: Config) -> None:
        self._bootstrap("plasmid_configure", config=config)

    def _bootstrap(self, hook: str, **kwargs: Any) -> None:
        """Call each implementation of bootstrap hook ``hook`` on its own, in pluggy's order; one
        that raises has what it did undone (its argument's ``snapshot()`` gives the undo) and its
        plugin follows the policy of the module docstring. Historic still: a plugin registered
        later is called at once (by pluggy, not isolated)."""
        caller, [value] = getattr(self.pm.hook, hook), kwargs.values()
        for impl in reversed(caller.get_hookimpls()):
            info, undo, user_errors = self.infos.get(impl.plugin_name), value.snapshot(), hook != "plasmid_addoption"
            try:
                impl.function(**{name: kwargs[name] for name in impl.argnames})
            except Exception as exc:
                if info is None or info.status == "kernel" or (user_errors and isinstance(exc, PlasmidError)):
                    raise
                undo()
                self.reject(info, f"failed in {hook}: {type(exc).__name__}: {exc}", fix=info.code_fix, error=exc)
        caller._call_history.append((kwargs, None))

    def observe(self, hook: str, **kwargs: Any) -> None:
        """Call every implementation of observer hook ``hook`` but those of plugins switched off; one
        that raises switches its plugin's observers off for the rest of the run and is a warning line
        (``observer_errors`` ``warn``) or, the first, kept in :attr:`observer_failure` (``fail``)."""
        for impl in reversed(getattr(self.pm.hook, hook).get_hookimpls()):
            if impl.plugin_name in self.switched_off:
                continue
            try:
                impl.function(**{name: kwargs[name] for name in impl.argnames})
            except Exception as exc:  # noqa: BLE001 - an observer never stops the run by itself
                self.switched_off.add(impl.plugin_name)
                info = self.infos.get(impl.plugin_name)
                failure = " ".join(f"plugin {info.label if info else repr(impl.plugin_name)} failed in {hook}: "
                                   f"{type(exc).__name__}: {exc}".split())
                if self.observer_errors == "fail":
                    self.observer_failure = self.observer_failure or failure
                else:
                    self.warn(f"{failure}; its observer hooks are off for the rest of the run (--observer-errors "
                              f"fail stops the run instead)")

    def metrics(self, step: int, metrics: dict[str, float]) -> None:
        self.observe("plasmid_metrics", step=step, metrics=metrics)

    def step_end(self, step: int, run_dir: str, metrics: dict[str, Any]) -> None:
        self.observe("plasmid_step_end", step=step, run_dir=run_dir, metrics=metrics)

    def weights_synced(self, step: int, report: Any) -> None:
        self.observe("plasmid_weights_synced", step=step, report=report)

    def registration_impls(self, hook_name: str) -> list[tuple[PluginInfo, Any]]:
        """``(plugin, hookimpl)`` pairs of one registration hook, in registration order."""
        caller = getattr(self.pm.hook, hook_name)
        pairs = []
        for impl in caller.get_hookimpls():
            info = self.infos.get(impl.plugin_name) or PluginInfo(impl.plugin_name, "?", "", "")
            pairs.append((info, impl))
        return pairs

    def report(self) -> list[dict[str, Any]]:
        """Every known plugin as a dict (for ``plasmid plugins --json``)."""
        return [asdict(info) for info in self.infos.values()]
