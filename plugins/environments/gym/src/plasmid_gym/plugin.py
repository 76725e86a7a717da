"""Hook implementations of plasmid-gym: options, the ``gym`` data source, generate function and reward."""

from __future__ import annotations

from collections.abc import Callable

from plasmid import hookimpl
from plasmid.config import Config, OptionParser
from plasmid_gym.options import GymOptions


@hookimpl
def plasmid_addoption(parser: OptionParser) -> None:
    parser.add_options(GymOptions)


@hookimpl
def plasmid_defaults(config: Config) -> None:
    """``--datasource gym``: the recipe (:mod:`plasmid_gym.recipe`)."""
    if config.option.datasource == "gym":
        from plasmid_gym.recipe import apply_recipe

        apply_recipe(config)


@hookimpl
def plasmid_datasources(register: Callable[..., None]) -> None:
    register("gym", "plasmid_gym.source:GymSource")


@hookimpl
def plasmid_generate_fns(register: Callable[..., None]) -> None:
    register("gym", "plasmid_gym.generate:GymGenerate")


@hookimpl
def plasmid_rewards(register: Callable[..., None]) -> None:
    register("gym", "plasmid_gym.reward:GymReward")
