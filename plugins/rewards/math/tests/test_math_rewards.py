"""The math rewards keep the reward contract; format penalty, think tag, time limit, labels."""

from __future__ import annotations

import time

import plasmid_math.plugin
import pytest
from plasmid_math.extract import final_answer
from plasmid_math.normalize import normalize
from plasmid_math.rewards import MissingLabelError
from plasmid_math.symbolic import SymbolicChecker

from plasmid.testing import RewardContract, build, make_config, run
from plasmid.types import Sample

MATH_CASES = [
    (r"so \boxed{\frac{1}{2}}", "0.5"),
    ("The answer is 7.", "7"),
    ("I think 3 or 4", "4"),
    ("no idea", "2"),
    (r"\boxed{2x+2}", "2(x+1)"),
    (r"<think>maybe 3</think> The answer is \boxed{4}", ["4", "four"]),
]


class TestMathContract(RewardContract):
    plugin = plasmid_math.plugin
    provider = "math"
    cases = MATH_CASES


class TestMathFormatContract(RewardContract):
    plugin = plasmid_math.plugin
    provider = "math-format"
    cases = MATH_CASES


def reward(provider="math", **options):
    return build("reward", provider, plasmid_math.plugin, config=make_config(plasmid_math.plugin, **options))


@pytest.mark.parametrize(("response", "expected"), [
    (r"\boxed{4}", 1.0),                       # explicit and right
    ("The answer is 4.", 1.0),                  # explicit and right
    (r"\boxed{5}", 0.0),                        # explicit and wrong
    ("2 + 2 makes 4", 0.0),                     # right, but only as the last number: penalised
    ("2 + 2 makes 5", -1.0),                    # wrong and not stated
    ("I do not know", -1.0),                    # nothing at all
])
def test_math_format_subtracts_the_penalty_without_an_explicit_answer(response, expected):
    assert reward("math-format").score(response, "4") == expected


def test_the_format_penalty_is_an_option():
    assert reward("math-format", math_format_penalty=0.25).score("no answer", "4") == -0.25


def test_plain_math_accepts_the_last_number_and_has_no_penalty():
    assert reward("math").score("2 + 2 makes 4", "4") == 1.0
    assert reward("math").score("I do not know", "4") == 0.0


def test_with_the_think_tag_only_the_text_after_it_is_graded():
    thinking = reward("math", math_think_tag="</think>")
    assert thinking.score(r"<think>\boxed{3}</think> so \boxed{4}", "4") == 1.0
    assert thinking.score(r"<think>\boxed{4}</think> hmm, \boxed{3}", "4") == 0.0
    assert thinking.score(r"<think>the answer is \boxed{4}", "4") == 0.0  # no </think>: no answer
    assert reward("math").score(r"<think>the answer is \boxed{4}", "4") == 1.0


def test_another_think_tag_can_be_named():
    custom = reward("math-format", math_think_tag="</reasoning>")
    assert custom.score(r"<reasoning>x</reasoning>\boxed{4}", "4") == 1.0
    assert custom.score(r"\boxed{4}", "4") == 0.0 - 1.0  # no tag: no answer, so the penalty


def test_a_pathological_expression_stops_at_the_time_limit_and_the_checker_recovers():
    checker = SymbolicChecker(timeout=1.0)
    try:
        started = time.perf_counter()  # within the bounds, but sympy's simplify takes minutes
        assert checker.equal("(x+y+z+1)^(40)", "(x+y+z+2)^(40)") is False
        assert time.perf_counter() - started < 20  # 1 s limit, plus starting the worker on a busy machine
        assert checker.timeouts == 1
        assert checker.equal("2x+2", "2(x+1)") is True  # a fresh worker answers
    finally:
        checker.close()


def test_the_reward_scores_a_pathological_answer_zero_within_the_time_limit():
    hard = reward("math", math_symbolic_timeout=1.0)
    try:
        started = time.perf_counter()
        assert run(hard(Sample(response=r"\boxed{(x+y+z+1)^{40}}", label="(x+y+z+2)^{40}"))) == 0.0
        assert time.perf_counter() - started < 20
    finally:
        hard.symbolic.close()


def test_the_time_limit_holds_for_all_the_checks_of_one_response_together():
    hard = reward("math", math_symbolic_timeout=1.0)
    answer = ", ".join(f"(x+y+z+{k})^{{40}}\\%" for k in range(1, 5))
    label = ", ".join(f"(x+y+z+{k})^{{41}}\\%" for k in range(1, 5))
    try:
        assert hard.score(r"\boxed{2x}", "x+1") == 0.0  # starts the worker
        started = time.perf_counter()
        assert hard.score(f"\\boxed{{{answer}}}", label) == 0.0
        # the first item against four, each pair read four ways (with and without %): 16 slow checks
        assert time.perf_counter() - started < 5  # one time limit of 1 s in all, and a worker killed
        assert hard.symbolic.timeouts == 1
    finally:
        hard.symbolic.close()


def test_code_in_an_answer_is_never_evaluated():
    checker = SymbolicChecker(timeout=5.0)
    try:
        assert checker.equal("__import__('os').system('touch /tmp/pwned')", "0") is False
    finally:
        checker.close()


def test_a_missing_label_is_an_error_that_says_where_to_get_one():
    with pytest.raises(MissingLabelError, match="--label-key"):
        run(reward("math")(Sample(response=r"\boxed{1}", label=None)))
    with pytest.raises(TypeError, match="labels are strings, numbers"):
        run(reward("math")(Sample(response=r"\boxed{1}", label={"answer": 1})))


@pytest.mark.parametrize(("text", "answer", "how"), [
    (r"a \boxed{\frac{1}{2}} b", r"\frac{1}{2}", "boxed"),
    (r"\boxed{a{b{c}}d}", "a{b{c}}d", "boxed"),
    (r"\boxed{\{1,2\}}", r"\{1,2\}", "boxed"),
    ("The final answer is: 12. Done.", "12", "sentence"),
    ("Answer: (B)", "(B)", "sentence"),
    ("Let me answer this: 3 apples and 4 pears", "4", "last-number"),
    ("it costs 1,500 dollars", "1,500", "last-number"),
    ("ratio 3/4", "3/4", "last-number"),
])
def test_final_answer_extraction(text, answer, how):
    found = final_answer(text)
    assert (found.text, found.how) == (answer, how)


@pytest.mark.parametrize(("raw", "normal"), [
    (r"$\dfrac{1}{2}$", r"\frac{1}{2}"),
    (r"\frac12", r"\frac{1}{2}"),
    (r"\left[ 1, 2 \right)", "[1,2)"),
    ("1,000,000", "1000000"),
    ("1,2", "1,2"),
    (r"10\%", "10%"),
    (r"4\text{ cm}^2", "4"),
    ("5 m", "5"),
    (r"\sin^2 x", r"\sin^2x"),
    ("2.500", "2.5"),
    (r"\mathrm{Paris}", "paris"),
    ("y = 2x + 1", "2x+1"),
    ("x + y = 3", "x+y=3"),
    ("forty-two", "42"),
])
def test_normalisation(raw, normal):
    assert normalize(raw) == normal
