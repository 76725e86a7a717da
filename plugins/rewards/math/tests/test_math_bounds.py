"""Hostile answers (issue 33) are scored 0, or correctly, within seconds, in-process, and none raises.

Before the bounds (:mod:`plasmid_math.bounds`), ``\\boxed{1e50000000}`` took 67-298 s, long runs
of spaces or thousands separators minutes, ``9^{9^{9}}`` the full symbolic time limit (5 s), and
``1e400``, a 5,000-digit integer, ``5²`` and 3,000 nested braces raised. Each now takes
milliseconds; :data:`SECONDS` is generous for a busy machine and still far below the old costs.
"""

from __future__ import annotations

import time

import plasmid_math.plugin
import pytest
from plasmid_math.bounds import MAX_ANSWER_CHARS
from plasmid_math.extract import final_answer

from plasmid.testing import build, make_config, run
from plasmid.types import Sample

SECONDS = 2.0
THOUSANDS = "1" + ",000" * 25_000  # 100 KB of thousands separators

HOSTILE = [
    # (response, label, expected score)
    pytest.param(r"\boxed{1e50000000}", "1", 0.0, id="exponent-50-million"),
    pytest.param("The answer is 1e20000000", "1", 0.0, id="exponent-20-million-in-a-sentence"),
    pytest.param(r"\boxed{1e400}", "5", 0.0, id="1e400-beyond-a-float"),
    pytest.param(r"\boxed{1e400}", "1e400", 1.0, id="1e400-equals-itself"),
    pytest.param(r"\boxed{1e1001}", "1e1001", 1.0, id="out-of-bounds-equals-itself-as-text"),
    pytest.param(r"\boxed{1e-1001}", "0", 0.0, id="1e-1001-is-not-0"),
    pytest.param("\\boxed{" + "7" * 5000 + "}", "5", 0.0, id="5000-digit-integer"),
    pytest.param("\\boxed{" + "7" * 5000 + "}", "7" * 5000, 1.0, id="5000-digit-label-equals-itself"),
    pytest.param("\\boxed{" + "7" * 400 + "}", "7" * 399 + "8", 0.0, id="400-digit-integers-exactly"),
    pytest.param("The total is " + THOUSANDS + ",", "5", 0.0, id="thousands-separators-then-a-comma"),
    pytest.param("The total is " + THOUSANDS + "0", "5", 0.0, id="thousands-separators-then-a-digit"),
    pytest.param(r"\boxed{" + THOUSANDS + "}", "5", 0.0, id="thousands-separators-boxed"),
    pytest.param("The answer" + " " * 100_000 + "x", "5", 0.0, id="100k-spaces-after-answer"),
    pytest.param("The answer is" + " " * 100_000 + "5", "5", 1.0, id="100k-spaces-before-the-answer"),
    pytest.param("\\boxed{5" + " " * 100_000 + "}", "5", 1.0, id="100k-spaces-boxed-are-stripped"),
    pytest.param("\\boxed{5" + " " * 100_000 + "x}", "5", 0.0, id="100k-spaces-boxed"),
    pytest.param("\\boxed{5" + " " * 490 + "cm}", "5", 1.0, id="490-spaces-before-a-unit"),
    pytest.param(r"\boxed{9^{9^{9}}}", "5", 0.0, id="power-tower"),
    pytest.param(r"\boxed{9^{9^{9}}}", "9^{9^{9}}", 1.0, id="power-tower-equals-itself-as-text"),
    pytest.param(r"\boxed{(9^9)^{9^9}}", "5", 0.0, id="power-of-a-power"),
    pytest.param(r"\boxed{2^{2^{2^{2^{2^{2}}}}}}", "1", 0.0, id="tower-of-twos"),
    pytest.param(r"\boxed{(\sqrt{2})^{10^{9}}}", "1", 0.0, id="power-of-a-root"),
    pytest.param(r"\boxed{10^{10^{10}}}", r"10^{10^{10}+1}", 0.0, id="power-tower-against-power-tower"),
    pytest.param("\\boxed{" + "x^" * 200 + "x}", "1", 0.0, id="tower-of-200-symbols"),
    pytest.param(r"\boxed{e^{e^{e^{100}}}}", "x", 0.0, id="tower-of-exponentials"),
    pytest.param(r"\boxed{\exp(\exp(\exp(100)))}", "x", 0.0, id="tower-of-exp"),
    pytest.param(r"\boxed{e^{i\pi}}", "-1", 1.0, id="an-honest-exponential"),
    pytest.param(r"\boxed{2^{10}}", "1024", 1.0, id="an-honest-power"),
    pytest.param(r"\boxed{2^{2023}}", r"2 \cdot 2^{2022}", 1.0, id="an-honest-large-power"),
    pytest.param("\\boxed{" + "{" * 3000 + "1" + "}" * 3000 + "}", "1", 0.0, id="3000-nested-braces"),
    pytest.param("\\boxed{" + "{" * 100 + "1" + "}" * 100 + "}", "2", 0.0, id="100-nested-braces"),
    pytest.param("\\boxed{" + "(" * 100 + "x" + ")" * 100 + "}", "y", 0.0, id="100-nested-parentheses"),
    pytest.param("\\boxed{" + "\\frac{1}{" * 40 + "2" + "}" * 40 + "}", "2", 0.0, id="40-nested-fractions"),
    pytest.param("\\boxed{" + "-" * 400 + "x}", "x", 1.0, id="400-minus-signs"),
    pytest.param(r"\boxed{5²}", "25", 0.0, id="a-superscript-digit"),
]


@pytest.fixture(scope="module")
def math_reward():
    reward = build("reward", "math", plasmid_math.plugin, config=make_config(plasmid_math.plugin))
    assert reward.score(r"\boxed{2x}", "x+1") == 0.0  # starts the sympy worker, outside the timed part
    yield reward
    reward.symbolic.close()


@pytest.mark.parametrize(("response", "label", "expected"), HOSTILE)
def test_a_hostile_answer_is_scored_within_seconds_and_never_raises(math_reward, response, label, expected):
    timeouts, started = math_reward.symbolic.timeouts, time.perf_counter()
    assert math_reward.score(response, label) == expected
    assert time.perf_counter() - started < SECONDS
    assert math_reward.symbolic.timeouts == timeouts  # refused by a bound, not stopped at the time limit


def test_the_async_call_scores_a_hostile_answer_quickly_too(math_reward):
    started = time.perf_counter()
    assert run(math_reward(Sample(response=r"\boxed{1e50000000}", label="1"))) == 0.0
    assert time.perf_counter() - started < SECONDS


def test_an_answer_longer_than_the_cap_is_not_read_unless_the_label_is_as_long(math_reward):
    padded = "1" + "\\;" * ((MAX_ANSWER_CHARS - 1) // 2)  # spacing: normalised away
    assert len(padded) <= MAX_ANSWER_CHARS < len(padded + "\\;")
    assert math_reward.score(f"\\boxed{{{padded}}}", "1") == 1.0
    assert math_reward.score(f"\\boxed{{{padded}\\;}}", "1") == 0.0
    long_label = "+".join(["x"] * MAX_ANSWER_CHARS)
    assert math_reward.score(f"\\boxed{{{long_label}}}", long_label) == 1.0


@pytest.mark.parametrize("text", [
    pytest.param("1" + ",000" * 50_000 + ",", id="thousands-then-a-comma"),
    pytest.param("1" + ",000" * 50_000 + "0", id="thousands-then-a-digit"),
    pytest.param("12,345" * 30_000, id="glued-thousands"),
    pytest.param("answer" + " " * 200_000 + "x", id="spaces-after-answer"),
    pytest.param("final" + " " * 200_000 + "x", id="spaces-after-final"),
    pytest.param("The answer is **" + " " * 200_000, id="spaces-after-the-answer-is"),
    pytest.param(("answer " + " " * 50) * 4_000, id="many-answers-and-spaces"),
    pytest.param("\\boxed{" + "{" * 200_000, id="unbalanced-braces"),
    pytest.param("\\boxed " + "9" * 200_000, id="200k-digits"),
    pytest.param("1." * 100_000, id="dots"),
    pytest.param("-" * 200_000 + "1", id="minus-signs"),
])
def test_extraction_is_linear_time_on_hostile_200kb_responses(math_reward, text):
    started = time.perf_counter()
    final_answer(text)
    math_reward.score(text, "5")
    assert time.perf_counter() - started < SECONDS
