"""The match options are declared once: a bad value is a one-line error naming its flag, and the
typed read gives the declared default."""

from __future__ import annotations

import plasmid_match.plugin
import pytest
from plasmid_match.options import MatchOptions
from plasmid_match.rewards import ChoiceReward

from plasmid.errors import UsageError
from plasmid.testing import make_config


def test_the_typed_read_gives_the_declared_default():
    options = MatchOptions.of(make_config(plasmid_match.plugin))
    assert options == MatchOptions.defaults()
    assert options.choice_letters == "ABCDE" and options.letters == "ABCDE"


def test_the_letters_are_upper_case_each_once_in_order():
    assert MatchOptions.of(make_config(plasmid_match.plugin, choice_letters="abcab")).letters == "ABC"


@pytest.mark.parametrize(("bad", "message"), [
    ("", "--choice-letters '': give the option letters in order, such as ABCDE"),
    ("A,B,C", "--choice-letters 'A,B,C': give the option letters in order, such as ABCDE"),
])
def test_bad_letters_are_a_one_line_usage_error_naming_the_flag(bad, message):
    with pytest.raises(UsageError) as raised:
        make_config(plasmid_match.plugin, choice_letters=bad)
    assert str(raised.value) == message


def test_the_choice_reward_lists_the_options_it_reads():
    assert ChoiceReward.option_classes == (MatchOptions,)
