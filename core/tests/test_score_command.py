"""``plasmid score``: responses on stdin, one JSON result per line, errors that name the line.

The rewards come from a local plugin file (``--plugins ./file.py``), so the kernel is tested
without any installed reward package.
"""

from __future__ import annotations

import io
import json
import time

import pytest

from plasmid.app.cli import main
from plasmid.app.score import score_command
from plasmid.errors import ProviderError, UsageError

REWARDS = '''
import time

from plasmid import hookimpl


class Contains:
    """1.0 when the label occurs in the response."""

    def __init__(self, config):
        pass

    async def __call__(self, sample):
        if sample.label is None:
            raise ValueError("no label")
        return 1.0 if str(sample.label) in sample.response else 0.0


class Length:
    def __init__(self, config):
        pass

    async def __call__(self, sample):
        return {"chars": float(len(sample.response)), "words": float(len(sample.response.split()))}


class Rank:
    """A group reward: 1.0 for the longest response of the group, 0.0 for the others."""

    group = True

    def __init__(self, config):
        pass

    async def __call__(self, samples):
        longest = max(len(s.response) for s in samples)
        return [1.0 if len(s.response) == longest else 0.0 for s in samples]


class Hang:
    """Blocks its event loop: time.sleep inside async def."""

    def __init__(self, config):
        pass

    async def __call__(self, sample):
        time.sleep(20)
        return 1.0


class Huge:
    def __init__(self, config):
        pass

    async def __call__(self, sample):
        return 1e39


@hookimpl
def plasmid_rewards(register):
    register("contains", Contains)
    register("hang", Hang)
    register("huge", Huge)
    register("length", Length)
    register("rank", Rank)
'''


@pytest.fixture
def plugin(tmp_path):
    path = tmp_path / "score_rewards.py"
    path.write_text(REWARDS)
    return str(path)


def score(plugin, lines, *args):
    out = io.StringIO()
    assert score_command(["--plugins", plugin, *args], io.StringIO(lines), out) == 0
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_each_line_gets_its_total_and_components(plugin):
    lines = '{"response": "it is 42", "label": "42"}\nnothing here\n\n{"response": "42", "label": "7"}\n'
    results = score(plugin, lines, "--reward", "contains", "--label", "nothing")
    assert results == [
        {"line": 1, "reward": 1.0, "components": {"contains": 1.0}},
        {"line": 2, "reward": 1.0, "components": {"contains": 1.0}},  # plain text, the --label applies
        {"line": 4, "reward": 0.0, "components": {"contains": 0.0}},
    ]


def test_weights_and_reward_key_combine_as_in_training(plugin):
    results = score(plugin, '{"response": "a b c", "label": "b"}\n', "--reward", "contains",
                    "--reward", "length:0.5", "--reward-key", "words")
    assert results == [{"line": 1, "reward": 1.0 + 0.5 * 3.0, "components": {"contains": 1.0, "length": 3.0}}]


def test_a_failing_reward_scores_zero_and_is_reported_on_the_line(plugin, capsys):
    results = score(plugin, "no label here\n", "--reward", "contains")
    assert results[0]["reward"] == 0.0
    assert results[0]["errors"] == ["contains: ValueError: no label"]
    assert "contains: ValueError x1" in capsys.readouterr().err


def test_with_reward_errors_fail_a_failing_reward_stops_naming_it(plugin):
    with pytest.raises(ProviderError, match="reward 'contains' from plugin 'score_rewards'"):
        score(plugin, "no label here\n", "--reward", "contains", "--reward-errors", "fail")


def test_group_size_scores_consecutive_lines_together(plugin):
    lines = "a\nabc\nab\nabcd\nx\n"
    results = score(plugin, lines, "--reward", "rank", "--group-size", "2")
    assert [r["reward"] for r in results] == [0.0, 1.0, 0.0, 1.0, 1.0]


@pytest.mark.parametrize(("lines", "message"), [
    ('ok\n{"response": "x", \n', "stdin line 2: starts with '{' but is not valid JSON"),
    ('{"text": "x"}\n', 'stdin line 1: a JSON line needs a "response" string'),
    ('{"response": 3}\n', 'stdin line 1: a JSON line needs a "response" string'),
    ('{"response": "x", "metadata": [1]}\n', 'stdin line 1: "metadata" must be a JSON object'),
])
def test_unreadable_input_stops_with_a_message_naming_the_line(plugin, lines, message):
    with pytest.raises(UsageError, match=message.replace("{", r"\{")):
        score(plugin, lines, "--reward", "contains", "--label", "x")


def test_through_the_cli_bad_input_exits_2_with_the_message(plugin, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("fine\n{oops\n"))
    assert main(["score", "--plugins", plugin, "--reward", "contains", "--label", "fine"]) == 2
    captured = capsys.readouterr()
    assert json.loads(captured.out.splitlines()[0])["reward"] == 1.0
    assert "plasmid: error: stdin line 2" in captured.err


def test_an_unknown_reward_is_an_error_listing_the_available_ones(plugin, capsys):
    assert main(["score", "--plugins", plugin, "--reward", "contain"]) == 2
    assert "unknown reward 'contain'" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_a_reward_that_blocks_its_event_loop_times_out_instead_of_hanging(plugin, capsys):
    started = time.monotonic()
    results = score(plugin, "a\nb\n", "--reward", "hang:0.5", "--reward", "contains", "--label", "a",
                    "--reward-timeout", "0.5")
    assert time.monotonic() - started < 15
    assert [r["reward"] for r in results] == [1.0, 0.0]
    assert all(r["errors"] == ["hang: timed out"] for r in results)
    assert "reward 'hang' from plugin 'score_rewards'" in capsys.readouterr().err


def test_a_reward_above_float32_range_fails_on_its_line(plugin):
    results = score(plugin, "a\n", "--reward", "huge", "--reward", "contains", "--label", "a")
    assert results == [{"line": 1, "reward": 1.0, "components": {"huge": 0.0, "contains": 1.0},
                        "errors": ["huge: ValueError: returned 1e+39, outside float32 range (|reward| <= "
                                   "3.402823e+38)"]}]


def test_every_reward_failing_on_every_line_is_a_warning(plugin, capsys):
    score(plugin, "a\nb\n", "--reward", "huge", "--reward", "contains")
    warning = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warning) == 1 and warning[0].startswith(
        "plasmid: warning: every reward failed on all 2 samples scored (reward 'huge' from plugin "
        "'score_rewards'")
