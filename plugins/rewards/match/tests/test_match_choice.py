"""The ``choice`` reward: which option letter a response picks, against the label's letter."""

from __future__ import annotations

import plasmid_match.plugin
import pytest
from plasmid_match.choice import extract_choice
from plasmid_match.labels import MissingLabelError

from plasmid.testing import RewardContract, build, make_config, run
from plasmid.types import Sample


class TestChoiceContract(RewardContract):
    plugin = plasmid_match.plugin
    provider = "choice"
    cases = [("Answer: (B)", "B"), ("the answer is C", "B"), ("**D**", "(D)"), ("", "A"), ("B", 1)]


EXTRACTION = [
    # (response, picked)
    ("Answer: (B)", "B"),
    ("answer: b", "B"),
    ("The answer is C.", "C"),
    ("the answer is c", "C"),
    ("So the correct option is D", "D"),
    ("The correct answer is option E.", "E"),
    ("Final answer: **A**", "A"),
    ("Choice: (C) 42", "C"),
    (r"Hence $\boxed{D}$", "D"),
    (r"\boxed{\text{B}}", "B"),
    ("I would pick **D** here.", "D"),
    ("**(C)** is the right one", "C"),
    ("**B.** Paris", "B"),
    ("(A) is wrong because of x, so (C) it is", "C"),
    ("B", "B"),
    ("B) Paris", "B"),
    ("C. 42", "C"),
    ("Looking at the options, it must be D", "D"),
    ("A cat is not a dog, so E", "E"),
    ("The answer is a prime number, option B.", "B"),
    ("Answer: (B). Wait, no: the answer is D", "D"),
    ("none of these", None),
    ("", None),
    ("I think F", None),
    ("the answer is a", "A"),
]


@pytest.mark.parametrize(("response", "picked"), EXTRACTION)
def test_extract_choice(response, picked):
    assert extract_choice(response) == picked


def choice(**options):
    return build("reward", "choice", plasmid_match.plugin, config=make_config(plasmid_match.plugin, **options))


SCORES = [
    # (response, label, expected)
    ("Answer: (B)", "B", 1.0),
    ("Answer: (B)", "b", 1.0),
    ("Answer: (B)", "(B)", 1.0),
    ("Answer: (B)", "B. Paris", 1.0),
    ("Answer: (B)", "C", 0.0),
    ("Answer: (B)", 1, 1.0),
    ("Answer: (B)", 0, 0.0),
    ("Answer: (B)", ["A", "B"], 1.0),
    ("no letter at all", "B", 0.0),
]


@pytest.mark.parametrize(("response", "label", "expected"), SCORES)
def test_choice_scores_one_when_the_picked_letter_is_the_labels(response, label, expected):
    assert run(choice()(Sample(response=response, label=label))) == expected


def test_more_option_letters_can_be_allowed():
    with pytest.raises(MissingLabelError, match="--choice-letters"):
        run(choice()(Sample(response="The answer is G", label="G")))
    assert run(choice(choice_letters="ABCDEFGHIJ")(Sample(response="The answer is G", label="G"))) == 1.0
    assert run(choice(choice_letters="ABCDEFGHIJ")(Sample(response="x", label=9))) == 0.0


def test_a_label_without_a_letter_or_with_an_index_out_of_range_is_an_error():
    with pytest.raises(MissingLabelError, match="names no option letter"):
        run(choice()(Sample(response="A", label="Paris")))
    with pytest.raises(ValueError, match="outside --choice-letters"):
        run(choice()(Sample(response="A", label=7)))
    with pytest.raises(MissingLabelError):
        run(choice()(Sample(response="A", label=None)))
