"""The order of training prompts: file order, per-epoch shuffles, finite epochs, resume checks."""

import json

import pytest
from plasmid_jsonl import DataExhausted, plugin

from plasmid.errors import UsageError
from plasmid.testing import build

PROMPTS = [f"{n}+{n}=" for n in range(10)]


@pytest.fixture
def ten_prompts(write_jsonl):
    return write_jsonl("ten.jsonl", [{"prompt": prompt} for prompt in PROMPTS])


def jsonl_source(config):
    return build("datasource", "jsonl", plugin, config=config)


def prompts(groups):
    return [group.samples[0].prompt for group in groups]


def test_without_shuffle_every_epoch_is_in_file_order(jsonl_config, ten_prompts):
    source = jsonl_source(jsonl_config(prompt_data=ten_prompts))
    assert prompts(source.get_groups(25)) == PROMPTS + PROMPTS + PROMPTS[:5]


def test_shuffle_gives_each_epoch_a_new_order_fixed_by_the_seed(jsonl_config, ten_prompts):
    shuffled = jsonl_source(jsonl_config(prompt_data=ten_prompts, rollout_shuffle=True, seed=3))
    first, second = prompts(shuffled.get_groups(10)), prompts(shuffled.get_groups(10))
    assert sorted(first) == sorted(second) == sorted(PROMPTS)
    assert first != second and first != PROMPTS
    again = jsonl_source(jsonl_config(prompt_data=ten_prompts, rollout_shuffle=True, seed=3))
    assert prompts(again.get_groups(20)) == first + second
    other_seed = jsonl_source(jsonl_config(prompt_data=ten_prompts, rollout_shuffle=True, seed=4))
    assert prompts(other_seed.get_groups(10)) != first


def test_finite_epochs_serve_every_prompt_then_raise_data_exhausted(jsonl_config, ten_prompts):
    source = jsonl_source(jsonl_config(prompt_data=ten_prompts, num_epochs=2))
    assert prompts(source.get_groups(8)) + prompts(source.get_groups(8)) == (PROMPTS + PROMPTS)[:16]
    state = source.state_dict()
    with pytest.raises(DataExhausted, match=r"epoch\(s\) of --num-epochs are used up: 4 prompt\(s\) left, 8 needed"):
        source.get_groups(8)
    assert source.state_dict() == state, "the failing call consumed nothing"
    assert prompts(source.get_groups(4)) == PROMPTS[6:]
    with pytest.raises(DataExhausted):
        source.get_groups(1)


def test_given_back_groups_are_served_after_the_epochs_are_used_up(jsonl_config, ten_prompts):
    source = jsonl_source(jsonl_config(prompt_data=ten_prompts, num_epochs=1))
    drawn = source.get_groups(10)
    source.add_groups(drawn[-2:])
    assert prompts(source.get_groups(2)) == PROMPTS[-2:]


def test_data_exhausted_is_an_error_the_cli_reports_not_a_stop_iteration():
    from plasmid.errors import PlasmidError

    assert issubclass(DataExhausted, PlasmidError)
    assert not issubclass(DataExhausted, StopIteration)


def test_num_epochs_below_one_is_a_usage_error(jsonl_config, ten_prompts):
    with pytest.raises(UsageError, match="^--num-epochs 0: must be >= 1$"):
        jsonl_config(prompt_data=ten_prompts, num_epochs=0)


def test_resume_mid_epoch_continues_the_shuffled_order(jsonl_config, ten_prompts):
    config = jsonl_config(prompt_data=ten_prompts, rollout_shuffle=True)
    original = jsonl_source(config)
    original.get_groups(13)
    resumed = jsonl_source(config)
    resumed.load_state_dict(json.loads(json.dumps(original.state_dict())))
    assert prompts(resumed.get_groups(12)) == prompts(original.get_groups(12))


def test_resuming_over_different_data_is_refused(jsonl_config, ten_prompts, write_jsonl):
    state = jsonl_source(jsonl_config(prompt_data=ten_prompts)).state_dict()
    eleven = write_jsonl("eleven.jsonl", [{"prompt": prompt} for prompt in [*PROMPTS, "1+9="]])
    with pytest.raises(UsageError, match="saved over 10 prompts but --prompt-data .*eleven.jsonl now has 11"):
        jsonl_source(jsonl_config(prompt_data=eleven)).load_state_dict(state)
