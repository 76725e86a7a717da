"""Each match reward keeps the reward contract."""

from __future__ import annotations

import plasmid_match.plugin

from plasmid.testing import RewardContract

MATCH_CASES = [
    ("4", "4"),
    (" 4\n", "4"),
    ("5", "4"),
    ("The Eiffel Tower.", "eiffel tower"),
    ("x", ["y", "x"]),
    ("the cat sat", "cat"),
    ("7", 7),
]


class TestExactContract(RewardContract):
    plugin = plasmid_match.plugin
    provider = "exact"
    cases = MATCH_CASES


class TestNormalizedContract(RewardContract):
    plugin = plasmid_match.plugin
    provider = "normalized"
    cases = MATCH_CASES


class TestF1Contract(RewardContract):
    plugin = plasmid_match.plugin
    provider = "f1"
    cases = MATCH_CASES
