"""From a command line to a configured run: load plugins, parse options, resolve providers.

Order matters and is fixed: ``--plugins`` is read first (plugins can add options, so the full
command line is parsed only after they load), then options, then provider choices (written back
into ``config.option``), then the defaults hooks (recipes fill what the user left unset), then
every declared options class is converted and checked, then the configure hooks, which so see
the final values, then the checks of the run as a whole (a user-given ``--model`` exists, the
loss can learn from ``--n-samples-per-prompt``).

Nothing here writes: a recipe only names what it needs (the quickstart's tiny model as
``--model``), and the chosen data source creates it in :func:`plasmid.session.prepare`, which
``plasmid train`` calls after the run directory is checked (:mod:`plasmid.app.run`).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plasmid.config import ArgumentParser, Config, ConfigFiles, HelpText, OptionParser
from plasmid.errors import PluginError, UsageError
from plasmid.families import single_families
from plasmid.kernel_options import FaultOptions, GeneralOptions, RolloutOptions, default_run_dir, reward_weights
from plasmid.options import Options
from plasmid.plugins import PluginManager, Selection, installed_entry_points
from plasmid.prompt_limits import PromptLimit
from plasmid.protocols import SupportsMinSamples
from plasmid.registry import Registry
from plasmid.stop_tokens import check_stop_token_ids


@dataclass
class Startup:
    """A loaded and configured run, before any provider is built.

    :ivar prebuilt: providers built during start-up to check the user's input, by family
        (``"tokenizer"``, ``"datasource"``; :func:`plasmid.session.build_inputs`), which the
        session reuses.
    :ivar metrics: what start-up measured (``data/dropped_overlong``), logged with the first
        step the run makes (:func:`plasmid.loop.train`).
    """

    config: Config
    manager: PluginManager
    registry: Registry
    prebuilt: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


def preparse(argv: list[str], files: ConfigFiles | None = None) -> argparse.Namespace:
    """The options needed before plugins load: ``--plugins`` and ``--debug``, from the command line
    (``@files`` included) or else from a ``--config`` file (``plugins:``) that ``files`` reads."""
    parser = ArgumentParser(add_help=False, allow_abbrev=False, fromfile_prefix_chars="@")
    parser.add_argument("--plugins", default=None)
    parser.add_argument("--debug", action="store_true")
    parser.add_argument("--config", action="append", default=[])
    known, _ = parser.parse_known_args(argv)
    if known.plugins is None and known.config and files is not None:
        known.plugins = files.plugins_in(known.config)
    return known


def load_plugins(plugins_flag: str | None, environ: dict[str, str] | None = None) -> PluginManager:
    """A plugin manager with the plugins that ``--plugins`` / ``PLASMID_PLUGINS`` select."""
    environ = dict(os.environ) if environ is None else environ
    selection = Selection.from_env_or_flag(plugins_flag, installed_entry_points(), environ)
    manager = PluginManager()
    manager.load(selection)
    return manager


def start(argv: list[str], prog: str = "plasmid train", *,
          description: str = "Run RL post-training through the loaded plugins.",
          add_options: Callable[[OptionParser], None] | None = None, rewards_only: bool = False,
          files: ConfigFiles | None = None, help_text: HelpText | None = None) -> Startup:
    """Load plugins, parse ``argv``, resolve every provider choice and run the configure hooks.
    ``files`` reads ``--config`` files and ``help_text`` renders ``--help`` (:class:`OptionParser`;
    the application's commands pass theirs: :func:`plasmid.app.start.start`).

    For commands other than ``train`` (``plasmid score``): ``add_options`` adds the command's
    own options to the parser; ``rewards_only`` resolves only the rewards, leaving every other
    family unset, so that configure hooks preparing a training run (a data source's recipe
    building a model) do nothing.
    """
    early = preparse(argv, files)
    manager = load_plugins(early.plugins)
    registry = Registry.collect(manager)
    parser = OptionParser(prog=prog, description=description, files=files, help_text=help_text)
    manager.addoption(parser)
    registry.prune()  # the providers of a plugin skipped in plasmid_addoption
    if add_options is not None:
        add_options(parser)
    option = parser.parse(argv)
    run_dir = Path(option.run_dir) if option.run_dir else default_run_dir()
    config = Config(option=option, plugin_lock=manager.lock(), run_dir=run_dir, given=parser.given(argv))
    if rewards_only:
        resolve_rewards(config, registry)
    else:
        resolve_choices(config, registry)
    finish_configuration(config, manager, parser.option_classes)
    if registry.prune():  # a plugin skipped in a defaults or configure hook: a choice of it is an error
        (resolve_rewards if rewards_only else resolve_choices)(config, registry)
    config.plugin_lock, manager.observer_errors = manager.lock(), FaultOptions.of(config).observer_errors
    if not rewards_only:
        check_run(config, registry)
    return Startup(config, manager, registry)


def finish_configuration(config: Config, manager: PluginManager, option_classes: list[type[Options]]) -> None:
    """The defaults hooks, then every declared options class checked (the first bad value is a
    one-line ``UsageError`` naming its flag), then the configure hooks. Writes nothing: what a
    recipe names is created later (:func:`plasmid.session.prepare`)."""
    manager.defaults(config)
    for cls in option_classes:
        cls.of(config)
    manager.configure(config)


def check_run(config: Config, registry: Registry) -> None:
    """Checks of the configured run as a whole, before anything is built or written (one-line
    :class:`UsageError`):

    - a ``--model`` the user gave is an existing directory (a recipe's model is created later),
      whose context leaves room for ``--max-new-tokens`` and ``--max-prompt-length``
      (:meth:`plasmid.prompt_limits.PromptLimit.of`; a recipe's model is checked when its data
      source is built), and whose vocabulary holds every ``--stop-token-ids`` id;
    - the chosen loss can learn from ``--n-samples-per-prompt`` samples per prompt: a loss class
      declares ``min_samples_per_prompt`` (default 1) when it needs more, as group-normalised
      advantages do (a group of one has advantage 0, so nothing would be learnt);
    - ``--tools`` is given only with a generate function that calls them: its factory declares
      ``takes_tools = True`` (see :class:`~plasmid.protocols.GenerateFn`); with any other the
      tools would be built and never called;
    - ``--return-routed-experts`` (a trainer's routing replay) is given only with a generate
      function that copies the engine's routing into its samples (``carries_routed_experts =
      True``); with any other the replay would fail at its first training step.
    """
    model = GeneralOptions.of(config).model
    if model and config.is_given("model") and not Path(model).is_dir():
        what = "is a file, not a model directory" if Path(model).exists() else "no such directory"
        raise UsageError(f"--model {model}: {what} (give a local Hugging Face model directory)")
    PromptLimit.of(config)
    check_stop_token_ids(config)
    loss_name = config.option.loss
    if loss_name:
        n = RolloutOptions.of(config).n_samples_per_prompt
        needed = min_samples_per_prompt(registry, loss_name)
        if n < needed:
            usable = sorted(name for name in registry.providers["loss"]
                            if name != loss_name and _min_samples_or_none(registry, name) in range(1, n + 1))
            raise UsageError(
                f"--loss {loss_name} needs --n-samples-per-prompt of at least {needed} (its advantages compare "
                f"the samples of one prompt: with {n}, every advantage is 0 and nothing is learnt); raise "
                f"--n-samples-per-prompt, or choose a loss that learns from {n}: "
                f"{', '.join(usable) or 'none installed'}"
            )
    tools = list(getattr(config.option, "tools", None) or [])
    generate = config.option.generate
    if tools and generate and not takes_tools(registry, generate):
        callers = sorted(name for name in registry.providers["generate"] if _takes_tools_or_false(registry, name))
        raise UsageError(
            f"--tools {','.join(tools)}: --generate {generate} does not call tools, so they would never be used; "
            f"choose a generate function that does (--generate {' or '.join(callers) or '... (none installed)'}) "
            f"or drop --tools"
        )
    if RolloutOptions.of(config).return_routed_experts and generate \
            and not declares(registry, generate, "carries_routed_experts"):
        raise UsageError(
            f"--return-routed-experts: --generate {generate} does not carry the engine's expert routing into its "
            f"samples, so a routing replay (megatron's --routing-replay r3 asks for it) would find none; use "
            f"--generate single-turn, or --routing-replay r2"
        )


def min_samples_per_prompt(registry: Registry, loss: str) -> int:
    """The loss's ``min_samples_per_prompt`` (1 when it declares none); loads its factory."""
    factory = registry.get("loss", loss).load()
    return int(factory.min_samples_per_prompt) if isinstance(factory, SupportsMinSamples) else 1


def declares(registry: Registry, generate: str, capability: str) -> bool:
    """Whether generate function ``generate``'s factory declares ``capability = True`` (see
    :class:`~plasmid.protocols.GenerateFn`); loads its factory."""
    return getattr(registry.get("generate", generate).load(), capability, False) is True


def takes_tools(registry: Registry, generate: str) -> bool:
    """Whether generate function ``generate`` calls the run's ``--tools`` (``takes_tools = True``)."""
    return declares(registry, generate, "takes_tools")


def _takes_tools_or_false(registry: Registry, generate: str) -> bool:
    try:
        return takes_tools(registry, generate)
    except PluginError:
        return False


def _min_samples_or_none(registry: Registry, loss: str) -> int | None:
    try:
        return min_samples_per_prompt(registry, loss)
    except PluginError:
        return None


def resolve_choices(config: Config, registry: Registry, *, strict: bool = True) -> None:
    """Write the chosen provider name of every family into ``config.option`` (errors name the
    candidates); rewards default to the single or default reward when ``--reward`` is unset.

    ``strict=False`` (tests building partial setups) leaves a family unset when it cannot be
    resolved instead of raising.
    """
    option = config.option

    def choose(family: str, name: str | None) -> str | None:
        try:
            return registry.choose(family, name).name
        except PluginError:
            if strict:
                raise
            return name

    for family in single_families():
        setattr(option, family.option, choose(family.name, getattr(option, family.option)))
    resolve_rewards(config, registry, strict=strict)
    for name in option.filter:
        registry.get("filter", name)
    option.tools = tool_names(getattr(option, "tools", None) or [])
    for name in option.tools:
        registry.get("tool", name)


def tool_names(values: list[str]) -> list[str]:
    """The ``--tools`` names in order: each value may list several (``--tools calculator,python``);
    blanks around commas are ignored. An empty name or a name given twice is a :class:`UsageError`."""
    names: list[str] = []
    for value in values:
        for name in (part.strip() for part in value.split(",")):
            if not name:
                raise UsageError(f"--tools {value!r}: an empty tool name (expected NAME or NAME,NAME,...)")
            if name in names:
                raise UsageError(f"--tools: tool '{name}' is given twice; name each tool once")
            names.append(name)
    return names


def resolve_rewards(config: Config, registry: Registry, *, strict: bool = True) -> None:
    """Default ``--reward`` to the single or default reward when unset, and check every named
    reward exists (errors name the candidates)."""
    option = config.option
    if not option.reward:
        try:
            option.reward = [registry.choose("reward", None).name]
        except PluginError:
            if strict:
                raise
            option.reward = []
    for text in option.reward:
        registry.get("reward", text.partition(":")[0])
    option.reward_weights = reward_weights(config)
