"""``plasmid_serving.turns``: the per-turn reward key and its checker, importable without torch (the
agent plugin writes the key, and runs where no torch is installed); plasmid_torch.turns re-exports them."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from plasmid_serving.turns import TURN_REWARDS_KEY, checked_turn_rewards


def test_good_turns_come_back_as_int_offsets_and_float_rewards():
    assert checked_turn_rewards([[0, 0], (3, 1.5)], 5, "s") == [(0, 0.0), (3, 1.5)]


@pytest.mark.parametrize(("value", "message"), [
    ([], "must be a non-empty list"),
    ([[0, 1.0, 2.0]], "each turn is an \\[offset, reward\\] pair"),
    ([[0.0, 1.0]], "the offset 0.0; an offset is a token position"),
    ([[0, float("nan")]], "the reward nan at offset 0"),
    ([[0, True]], "the reward True"),
    ([[5, 1.0]], "the offset 5, outside the response's 5 tokens"),
    ([[2, 1.0], [2, 0.0]], "the offset 2 after 2; offsets must increase"),
])
def test_bad_turns_are_one_line_errors_naming_where_and_the_key(value, message):
    with pytest.raises(ValueError, match=message) as raised:
        checked_turn_rewards(value, 5, "sample 7")
    assert str(raised.value).startswith(f"sample 7: metadata[{TURN_REWARDS_KEY!r}]") and "\n" not in str(raised.value)


def test_the_module_imports_no_torch():
    code = "import sys, plasmid_serving.turns; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


@pytest.mark.skipif(importlib.util.find_spec("plasmid_torch") is None, reason="plasmid-torch is not installed")
def test_plasmid_torch_turns_re_exports_the_same_names():
    import plasmid_torch.turns

    assert plasmid_torch.turns.TURN_REWARDS_KEY is TURN_REWARDS_KEY
    assert plasmid_torch.turns.checked_turn_rewards is checked_turn_rewards
