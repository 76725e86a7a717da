"""The train/eval split: mod10 trains and evaluates on all 100 prompts; larger tasks hold out a
fixed eval split that training never visits."""

import pytest
from plasmid_tasks import plugin
from plasmid_tasks.permutation import Permutation

from plasmid.errors import UsageError
from plasmid.testing import build, make_config


def tasks_source(tmp_path, **options):
    """The source without the recipe (no model: char encoding), one sample per group."""
    config = make_config(plugin, run_dir=tmp_path / "run", n_samples_per_prompt=1, **options)
    return build("datasource", "tasks", plugin, config=config)


def prompts(groups):
    return [group.samples[0].prompt for group in groups]


@pytest.mark.parametrize("size", [1, 2, 3, 10, 100, 1000, 1001])
def test_permutation_visits_every_item_exactly_once(size):
    permutation = Permutation(size, key="k")
    assert sorted(permutation[position] for position in range(size)) == list(range(size))


def test_permutation_depends_on_its_key_only():
    same = [Permutation(100, "a")[i] for i in range(100)], [Permutation(100, "a")[i] for i in range(100)]
    assert same[0] == same[1]
    assert same[0] != [Permutation(100, "b")[i] for i in range(100)]
    assert same[0] != list(range(100))


def test_mod10_eval_is_all_100_prompts_in_fixed_order(tmp_path):
    eval_prompts = prompts(tasks_source(tmp_path).eval_groups())
    assert eval_prompts == [f"{a}+{b}=" for a in range(10) for b in range(10)]


def test_mod10_training_visits_all_100_prompts_each_epoch_in_a_new_order(tmp_path):
    source = tasks_source(tmp_path)
    first, second = prompts(source.get_groups(100)), prompts(source.get_groups(100))
    every_prompt = sorted(f"{a}+{b}=" for a in range(10) for b in range(10))
    assert sorted(first) == sorted(second) == every_prompt
    assert first != second, "each epoch is reshuffled"
    assert first != every_prompt


def test_the_seed_changes_the_training_order_not_the_eval_split(tmp_path):
    seed0, seed1 = tasks_source(tmp_path, seed=0, task="reverse"), tasks_source(tmp_path, seed=1, task="reverse")
    assert prompts(seed0.get_groups(20)) != prompts(seed1.get_groups(20))
    assert prompts(seed0.eval_groups()) == prompts(seed1.eval_groups())


@pytest.mark.parametrize("task", ["reverse", "digitsum"])
def test_held_out_eval_split_has_its_size_and_training_never_sees_it(tmp_path, task):
    source = tasks_source(tmp_path, task=task, task_length=3, task_eval_size=150)
    held_out = prompts(source.eval_groups())
    assert len(held_out) == len(set(held_out)) == 150
    one_epoch = prompts(source.get_groups(1000 - 150))
    assert len(set(one_epoch)) == 850, "one epoch visits every training prompt once"
    assert not set(one_epoch) & set(held_out)


def test_addition_with_an_astronomical_domain_draws_lazily_and_holds_out(tmp_path):
    source = tasks_source(tmp_path, task="addition", task_digits=8)  # 10^16 prompts
    held_out = set(prompts(source.eval_groups()))
    drawn = source.get_groups(300)
    assert len(held_out) == 200
    assert not set(prompts(drawn)) & held_out
    assert all(len(group.samples[0].label) == 9 for group in drawn)


def test_eval_size_that_leaves_nothing_to_train_on_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match=r"--task-eval-size 100: task reverse\(length=2\) has 100 prompts"):
        tasks_source(tmp_path, task="reverse", task_length=2, task_eval_size=100)


def test_resuming_with_another_task_is_refused(tmp_path):
    state = tasks_source(tmp_path, task="reverse").state_dict()
    with pytest.raises(UsageError, match="saved for 'reverse.*this run has 'digitsum"):
        tasks_source(tmp_path, task="digitsum").load_state_dict(state)
