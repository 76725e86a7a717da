"""Hook implementations of plasmid-verifiers: options, the recipe, the start-up version check,
the ``verifiers`` data source and reward."""

from __future__ import annotations

from collections.abc import Callable

from plasmid import hookimpl
from plasmid.config import Config, OptionParser
from plasmid.kernel_options import reward_weights
from plasmid_verifiers.options import VerifiersOptions

NAME = "verifiers"


@hookimpl
def plasmid_addoption(parser: OptionParser) -> None:
    parser.add_options(VerifiersOptions)


@hookimpl(trylast=True)
def plasmid_defaults(config: Config) -> None:
    """After the other plugins' defaults (plasmid-agent's would make the reward ``agent``)."""
    if config.option.datasource != NAME:
        return
    from plasmid_verifiers.recipe import apply_recipe

    apply_recipe(config)


@hookimpl
def plasmid_configure(config: Config) -> None:
    """A missing or unsupported verifiers, and a ``--vf-env`` this adapter cannot load or score (a
    group-level rubric, a v1 taskset on a verifiers without v1: :func:`plasmid_verifiers.vf.load_env`), are one line at
    start-up when this plugin is used."""
    if config.option.datasource == NAME or any(name == NAME for name, _ in reward_weights(config)):
        from plasmid_verifiers import vf

        vf.check_version()
        options = VerifiersOptions.of(config)
        if options.vf_env is not None:
            vf.load_env(options.vf_env, vf.canonical_args(vf.parse_env_args(options.vf_env_args)))


@hookimpl
def plasmid_datasources(register: Callable[..., None]) -> None:
    register(NAME, "plasmid_verifiers.source:VerifiersSource")


@hookimpl
def plasmid_rewards(register: Callable[..., None]) -> None:
    register(NAME, "plasmid_verifiers.reward:VerifiersReward")
