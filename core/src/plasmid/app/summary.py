"""What ``plasmid train`` prints about its plugins before the run directory line: a few lines.

::

    plasmid plugins (21): agent, code, dynamic, grpo, ... (-v lists their distributions and versions)
    providers: tokenizer=hf  datasource=tasks  engine=torchgen  ...  reward=exact
    reward: exact (the default: --reward was not given; --reward NAME[:WEIGHT] chooses, 'plasmid plugins' lists them)

The plugin list is one line of names by default; ``-v``/``--verbose`` lists one plugin a line
with its distribution and version (the lock of the run, ``plugins.lock.json``, always holds
them). When ``--reward`` was not given the reward chosen for it (the only one installed, or the
one a plugin marks as default) is named on a line of its own, so a run never scores with a
reward nobody chose knowingly.
"""

from __future__ import annotations

import argparse

from plasmid.app.rollout_store import add_save_option
from plasmid.config import Config, OptionParser
from plasmid.families import FAMILIES
from plasmid.startup import Startup

#: The option group of ``--verbose``.
GROUP = "output"


def add_train_options(parser: OptionParser) -> None:
    """The options ``plasmid train`` adds to the plugins' own: ``--save-rollouts DIR``
    (:mod:`plasmid.app.rollout_store`) and ``-v``/``--verbose``."""
    add_save_option(parser)
    parser.getgroup(GROUP, "what plasmid train prints").addoption(
        "--verbose", "-v", action=argparse.BooleanOptionalAction, default=False,
        help="list every loaded plugin at start-up with its distribution and version (default: their names on "
             "one line)")


def verbose(config: Config) -> bool:
    """Whether ``--verbose`` was given (``False`` where the command does not declare it)."""
    value = getattr(config.option, "verbose", False)
    return value is True


def describe_plugins(startup: Startup, *, full: bool | None = None) -> str:
    """The start-up summary (module docstring); ``full`` (default: ``--verbose``) lists one plugin a line."""
    config = startup.config
    option = config.option
    full = verbose(config) if full is None else full
    lock = config.plugin_lock
    if full:
        lines = ["plasmid plugins:", *(f"  {entry['name']:<14} {entry['distribution']} {entry['version']}"
                                       for entry in lock)]
    else:
        lines = [f"plasmid plugins ({len(lock)}): {', '.join(entry['name'] for entry in lock)} "
                 f"(-v lists their distributions and versions)"]
    chosen = {}
    for family in FAMILIES:
        value = getattr(option, family.option, None)
        if family.name != "runtime":
            chosen[family.flag[2:]] = (",".join(value) or "-") if isinstance(value, list) else value
    lines.append("providers: " + "  ".join(f"{k}={v}" for k, v in chosen.items()))
    rewards = list(getattr(option, "reward", None) or [])
    if rewards and not config.is_given("reward"):
        lines.append(f"reward: {', '.join(rewards)} (the default: --reward was not given; --reward NAME[:WEIGHT] "
                     f"chooses, 'plasmid plugins' lists them)")
    return "\n".join(lines)


__all__ = ["add_train_options", "describe_plugins", "verbose"]
