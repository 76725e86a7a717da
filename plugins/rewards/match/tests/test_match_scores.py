"""Hand-computed scores of each match reward, through the registered provider."""

from __future__ import annotations

import plasmid_match.plugin
import pytest

from plasmid.testing import build, make_registry, run
from plasmid.types import Sample


def score(provider: str, response: str, label) -> float:
    reward = build("reward", provider, plasmid_match.plugin)
    return run(reward(Sample(response=response, label=label)))


EXACT = [
    ("4", "4", 1.0),
    (" 4\n", "4", 1.0),
    ("4", " 4 ", 1.0),
    ("4.", "4", 0.0),
    ("4 4", "4", 0.0),
    ("Paris", "paris", 0.0),
    ("", "4", 0.0),
    ("5", ["4", "5"], 1.0),
    ("6", ["4", "5"], 0.0),
    ("7", 7, 1.0),
    ("7", [3, 7], 1.0),
]

NORMALIZED = [
    ("The Eiffel Tower.", "eiffel tower", 1.0),
    ("  PARIS ", "paris", 1.0),
    ("an apple", "apple", 1.0),
    ("theater", "ater", 0.0),  # articles are removed as whole words only
    ("New\tYork  City", "new york city", 1.0),
    ("rock-n-roll", "rocknroll", 1.0),
    ("Café!", "café", 1.0),
    ("Straße", "STRASSE", 1.0),  # case-folded, not just lower-cased
    ("«Oui»", "oui", 1.0),  # Unicode punctuation
    ("$5", "5", 1.0),  # ASCII symbols count as punctuation, as in SQuAD
    ("-3", "3", 1.0),  # ... which is why numbers belong to `exact`
    ("London", ["Paris", "the london"], 1.0),
    ("Paris", "London", 0.0),
    ("", "the", 1.0),  # both normalise to nothing
    ("", "paris", 0.0),
]

F1 = [
    ("the cat sat", "cat sat", 1.0),
    ("cat sat on mat", "cat sat", 2 / 3),  # precision 2/4, recall 2/2
    ("cat", "cat sat", 2 / 3),  # precision 1/1, recall 1/2
    ("cat cat cat", "cat", 0.5),  # a repeated word counts once per match: precision 1/3, recall 1
    ("dog", "cat", 0.0),
    ("a", "the", 1.0),  # both normalise to no words
    ("", "cat", 0.0),
    ("the", "cat", 0.0),
    ("red green", ["red green blue", "green"], 0.8),  # 0.8 against the first beats 2/3 against the second
    ("Red, GREEN!", "red green", 1.0),
]


@pytest.mark.parametrize(("response", "label", "expected"), EXACT)
def test_exact_scores(response, label, expected):
    assert score("exact", response, label) == expected


@pytest.mark.parametrize(("response", "label", "expected"), NORMALIZED)
def test_normalized_scores(response, label, expected):
    assert score("normalized", response, label) == expected


@pytest.mark.parametrize(("response", "label", "expected"), F1)
def test_f1_scores(response, label, expected):
    assert score("f1", response, label) == pytest.approx(expected)


def test_exact_is_the_default_reward_of_the_plugin():
    defaults = [p.name for p in make_registry(plasmid_match.plugin).providers["reward"].values() if p.default]
    assert defaults == ["exact"]
