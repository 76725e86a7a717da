"""Hook implementations of plasmid-tasks: options, the quickstart recipe, the ``tasks`` source."""

from __future__ import annotations

from plasmid import hookimpl
from plasmid_tasks.tasks import TASK_NAMES


@hookimpl
def plasmid_addoption(parser):
    group = parser.getgroup("tasks", "built-in synthetic tasks (--datasource tasks, the quickstart)")
    group.addoption("--task", default="mod10", choices=TASK_NAMES, help="which task (default: mod10)")
    group.addoption("--task-length", type=int, default=3, help="digits in a reverse/digitsum prompt")
    group.addoption("--task-digits", type=int, default=2, help="digits of each addition operand")
    group.addoption("--task-eval-size", type=int, default=200,
                    help="prompts held out for evaluation (all tasks but mod10, whose eval split is all 100)")
    group.addoption("--task-arch", default="qwen2", choices=["qwen2", "llama"],
                    help="architecture of the tiny model built when --model is not given")


@hookimpl
def plasmid_configure(config):
    if config.option.datasource != "tasks":
        return
    from plasmid_tasks.recipe import apply_quickstart_recipe

    apply_quickstart_recipe(config)


@hookimpl
def plasmid_datasources(register):
    register("tasks", "plasmid_tasks.source:TaskSource", default=True)
