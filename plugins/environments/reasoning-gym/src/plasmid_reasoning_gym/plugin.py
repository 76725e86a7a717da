"""Hook implementations of plasmid-reasoning-gym: options, the tiny-model recipe, the start-up
version check, the ``reasoning-gym`` data source and reward."""

from __future__ import annotations

from collections.abc import Callable

from plasmid import hookimpl
from plasmid.config import Config, OptionParser
from plasmid.kernel_options import reward_weights
from plasmid_reasoning_gym.options import ReasoningGymOptions

NAME = "reasoning-gym"


@hookimpl
def plasmid_addoption(parser: OptionParser) -> None:
    parser.add_options(ReasoningGymOptions)


@hookimpl
def plasmid_defaults(config: Config) -> None:
    if config.option.datasource != NAME:
        return
    from plasmid_reasoning_gym.recipe import apply_recipe

    apply_recipe(config)


@hookimpl
def plasmid_configure(config: Config) -> None:
    """A missing or unsupported reasoning-gym is one line at start-up when this plugin is used."""
    if config.option.datasource == NAME or any(name == NAME for name, _ in reward_weights(config)):
        from plasmid_reasoning_gym.gym import check_version

        check_version()


@hookimpl
def plasmid_datasources(register: Callable[..., None]) -> None:
    register(NAME, "plasmid_reasoning_gym.source:ReasoningGymSource")


@hookimpl
def plasmid_rewards(register: Callable[..., None]) -> None:
    register(NAME, "plasmid_reasoning_gym.reward:ReasoningGymReward")
