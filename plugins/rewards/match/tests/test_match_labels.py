"""How the match rewards read labels, and what they say when a label is missing or unusable."""

from __future__ import annotations

import plasmid_match.plugin
import pytest
from plasmid_match.labels import MissingLabelError, acceptable_answers
from plasmid_match.normalize import normalize_answer

from plasmid.rewards import RewardComponent, RewardSet
from plasmid.testing import build, run
from plasmid.types import Sample

PROVIDERS = ["exact", "normalized", "f1"]


def test_a_string_label_is_one_answer_and_a_list_is_several():
    assert acceptable_answers(Sample(label="4"), "exact") == ["4"]
    assert acceptable_answers(Sample(label=["4", "four"]), "exact") == ["4", "four"]
    assert acceptable_answers(Sample(label=("4", 4)), "exact") == ["4", "4"]
    assert acceptable_answers(Sample(label=2.5), "exact") == ["2.5"]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_missing_label_says_the_data_source_gave_none_and_how_to_set_one(provider):
    reward = build("reward", provider, plasmid_match.plugin)
    with pytest.raises(MissingLabelError) as error:
        run(reward(Sample(response="4", label=None, index=12)))
    message = str(error.value)
    assert f"reward '{provider}'" in message
    assert "sample 12" in message
    assert "data source gave none" in message
    assert "--label-key" in message


@pytest.mark.parametrize("provider", PROVIDERS)
def test_an_empty_list_of_answers_is_an_error(provider):
    reward = build("reward", provider, plasmid_match.plugin)
    with pytest.raises(MissingLabelError, match="empty list"):
        run(reward(Sample(response="4", label=[])))


@pytest.mark.parametrize("label", [True, {"answer": "4"}, ["4", None]])
def test_labels_that_are_not_text_or_numbers_are_a_type_error_naming_them(label):
    reward = build("reward", "exact", plasmid_match.plugin)
    with pytest.raises(TypeError, match="labels are a string, a number, or a list of them"):
        run(reward(Sample(response="4", label=label)))


def test_a_missing_label_is_counted_as_a_reward_failure_by_the_kernel():
    reward = build("reward", "exact", plasmid_match.plugin)
    rewards = RewardSet([RewardComponent("exact", 1.0, reward, plugin="match")])
    samples = [Sample(response="4", label="4"), Sample(response="4", label=None, index=1)]
    run(rewards.score_group(samples))
    assert [s.reward for s in samples] == [1.0, 0.0]
    assert "--label-key" in samples[1].metadata["reward_errors"][0]
    assert rewards.pop_metrics() == {"reward/failed/exact: MissingLabelError": 1.0}


@pytest.mark.parametrize(("text", "normalized"), [
    ("The Quick, Brown Fox!", "quick brown fox"),
    ("  an\n\tapple  a day ", "apple day"),
    ("The.", ""),
    ("theatre anthem", "theatre anthem"),
    ("Ünïcode — dash", "ünïcode dash"),
])
def test_normalization_folds_case_and_drops_punctuation_articles_and_extra_space(text, normalized):
    assert normalize_answer(text) == normalized
