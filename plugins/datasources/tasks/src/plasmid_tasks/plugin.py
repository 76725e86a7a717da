"""Hook implementations of plasmid-tasks: options, the quickstart recipe, the ``tasks`` source, and
the ``final-answer`` reward of ``--task toolcalc``."""

from __future__ import annotations

from collections.abc import Callable

from plasmid import hookimpl
from plasmid.config import Config, OptionParser
from plasmid_tasks.options import TaskOptions


@hookimpl
def plasmid_addoption(parser: OptionParser) -> None:
    parser.add_options(TaskOptions)


@hookimpl
def plasmid_defaults(config: Config) -> None:
    if config.option.datasource != "tasks":
        return
    from plasmid_tasks.recipe import apply_quickstart_recipe

    apply_quickstart_recipe(config)


@hookimpl
def plasmid_datasources(register: Callable[..., None]) -> None:
    register("tasks", "plasmid_tasks.source:TaskSource", default=True)


@hookimpl
def plasmid_rewards(register: Callable[..., None]) -> None:
    register("final-answer", "plasmid_tasks.toolcalc:FinalAnswer")
