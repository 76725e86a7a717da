"""The tasks options are declared once: a bad value is a one-line error naming its flag, and the
typed read gives the declared defaults."""

import pytest
from plasmid_tasks import plugin
from plasmid_tasks.options import TaskOptions
from plasmid_tasks.source import TaskSource
from plasmid_tasks.tasks import TASK_NAMES

from plasmid.errors import UsageError
from plasmid.kernel_options import GeneralOptions
from plasmid.options import option_fields
from plasmid.testing import make_config


def test_the_typed_read_gives_the_declared_defaults():
    options = TaskOptions.of(make_config(plugin))
    assert options == TaskOptions.defaults()
    assert (options.task, options.task_length, options.task_digits, options.task_eval_size, options.task_arch) == (
        "mod10", 3, 2, 200, "qwen2")


@pytest.mark.parametrize(("bad", "message"), [
    ({"task_length": 0}, "--task-length 0: must be >= 1"),
    ({"task_digits": 0}, "--task-digits 0: must be >= 1"),
    ({"task_eval_size": 0}, "--task-eval-size 0: must be >= 1"),
    ({"task": "mul"}, "--task 'mul': choose one of mod10, reverse, digitsum, addition, toolcalc, colours"),
    ({"task_arch": "gpt2"}, "--task-arch 'gpt2': choose one of qwen2, llama"),
    ({"task_length": "three"}, "--task-length: expected int, got 'three'"),
    ({"colours_warmup_steps": -1}, "--colours-warmup-steps -1: must be >= 0"),
])
def test_a_bad_value_is_a_one_line_usage_error_naming_its_flag(bad, message):
    with pytest.raises(UsageError) as raised:
        make_config(plugin, **bad)
    assert str(raised.value) == message


def test_a_bad_value_fails_before_the_recipe_builds_a_model(tmp_path):
    with pytest.raises(UsageError, match="--task-length 0"):
        make_config(plugin, run_dir=tmp_path / "run", datasource="tasks", task="reverse", task_length=0)
    assert not (tmp_path / "run").exists()


def test_the_task_choices_are_the_tasks():
    [task] = [field for field in option_fields(TaskOptions) if field.name == "task"]
    assert task.kind.choices == TASK_NAMES


def test_the_source_lists_the_options_it_reads():
    assert TaskOptions in TaskSource.option_classes and GeneralOptions in TaskSource.option_classes
