"""The ``math`` reward on hand-written (response, label, expected) cases, traps included.

Decisions these cases pin down: a percentage ``p%`` equals both ``p`` and ``p/100``; integers,
fractions and decimals compare exactly (``0.3333333333`` is not ``1/3``, ``1000001`` is not
``1000000``), and the relative tolerance of 1e-6 applies only to a float written in exponent form
(``3.333333333e-1`` is ``1/3``), to a float label, and to an irrational value sympy evaluates
(``3.14159265`` is ``\\pi``, ``3.14`` is not); a digit followed by a
numeric ``\\frac`` is a mixed number (``3\\frac{1}{2}`` is 3.5); bare lists and sets compare
unordered, intervals and tuples ordered with their brackets; ``x = 3`` and ``x \\in S`` are
graded on their right-hand side; a number spelt in words equals its digits.
"""

from __future__ import annotations

import plasmid_math.plugin
import pytest

from plasmid.testing import build, make_config

CASES = [
    # ------------------------------------------------------------------ extraction
    (r"The sum is \boxed{12}.", "12", 1.0),
    (r"So \boxed{12}. Checking other cases gives 13 and 14.", "12", 1.0),
    (r"First \boxed{3}; no, that was wrong: \boxed{4}", "4", 1.0),
    (r"\boxed{\frac{1}{2}}", "1/2", 1.0),
    (r"\boxed{\sqrt{\frac{3}{4}}}", r"\frac{\sqrt{3}}{2}", 1.0),
    (r"\fbox{7}", "7", 1.0),
    (r"Therefore \boxed 7", "7", 1.0),
    ("The answer is 42.", "42", 1.0),
    ("Final Answer: 3.5", "3.5", 1.0),
    ("**Final Answer:** $-2$", "-2", 1.0),
    ("She has 4 apples, buys 5 more, so 9 in total", "9", 1.0),
    ("She has 4 apples, buys 5 more, so 9 in total", "4", 0.0),
    ("I cannot solve this.", "3", 0.0),
    ("", "3", 0.0),
    (r"The answer is \boxed{5}. Check: 2+2=4", "5", 1.0),
    ("The result is \u22127", "-7", 1.0),
    (r"\boxed{}", "0", 0.0),
    # ------------------------------------------------------------------ normalisation
    (r"\boxed{\dfrac12}", r"\frac{1}{2}", 1.0),
    (r"\boxed{\tfrac{3}{4}}", "0.75", 1.0),
    (r"\boxed{\left(1, 2\right)}", "(1,2)", 1.0),
    (r"\boxed{1,000}", "1000", 1.0),
    (r"\boxed{1{,}000{,}000}", "1000000", 1.0),
    ("The answer is 1,234,567.", "1234567", 1.0),
    ("In total 1,000, which is the sum", "1000", 1.0),
    (r"\boxed{5\text{ cm}}", "5", 1.0),
    (r"\boxed{12 \text{ square units}}", "12", 1.0),
    (r"\boxed{90^\circ}", "90", 1.0),
    (r"\boxed{90^{\circ}}", r"90^\circ", 1.0),
    (r"\boxed{\$18.90}", "18.9", 1.0),
    ("The answer is $5.00.", "5", 1.0),
    (r"\boxed{2.50}", "2.5", 1.0),
    (r"\boxed{x = 3}", "3", 1.0),
    (r"\boxed{.5}", "0.5", 1.0),
    (r"\boxed{3.0}", "3", 1.0),
    (r"\boxed{3 \text{ hours}}", r"3\text{ hrs}", 1.0),
    # ------------------------------------------------------------------ percentages
    (r"\boxed{10\%}", "10", 1.0),
    (r"\boxed{10\%}", "0.1", 1.0),
    (r"\boxed{0.1}", r"10\%", 1.0),
    (r"\boxed{10\%}", "0.01", 0.0),
    (r"\boxed{25 percent}", "25", 1.0),
    # ------------------------------------------------------------------ numbers
    ("The answer is 0.5", r"\frac{1}{2}", 1.0),
    (r"\boxed{1/2}", "0.5", 1.0),
    (r"\boxed{0.333}", r"\frac{1}{3}", 0.0),
    (r"\boxed{0.3333333333}", r"\frac13", 0.0),
    (r"\boxed{3.333333333e-1}", r"\frac13", 1.0),
    (r"\boxed{1000001}", "1000000", 0.0),
    (r"\boxed{1000000}", "1,000,000", 1.0),
    (r"\boxed{1.0000001e6}", "1000000", 1.0),
    (r"\boxed{1e-13}", "0", 0.0),
    (r"\boxed{0.0000000000001}", "0", 0.0),
    (r"\boxed{\frac{1}{3}}", "0.33333333333333333333", 0.0),
    (r"\boxed{12345678901234567891}", "12345678901234567890", 0.0),
    (r"\boxed{2}", "2.001", 0.0),
    (r"\boxed{-3}", "3", 0.0),
    (r"\boxed{-3}", "-3", 1.0),
    (r"The answer is $-\frac{1}{2}$", "-0.5", 1.0),
    (r"\boxed{\frac{-1}{2}}", "-1/2", 1.0),
    (r"\boxed{3\frac{1}{2}}", "3.5", 1.0),
    (r"\boxed{\frac{7}{2}}", r"3\frac12", 1.0),
    (r"\boxed{1e-3}", "0.001", 1.0),
    # ------------------------------------------------------------------ symbolic
    (r"\boxed{\frac{\sqrt{2}}{2}}", r"\frac{1}{\sqrt{2}}", 1.0),
    (r"\boxed{2x+2}", "2(x+1)", 1.0),
    (r"\boxed{x^2-1}", "(x-1)(x+1)", 1.0),
    (r"\boxed{x^2+1}", "(x-1)(x+1)", 0.0),
    (r"\boxed{\pi}", "3.14", 0.0),
    (r"\boxed{\pi}", "3.14159265", 1.0),
    (r"\boxed{2^{20}}", "1048577", 0.0),
    (r"\boxed{2^{20}}", "1048576", 1.0),
    (r"\boxed{\sqrt{2}}", "1.4142", 0.0),
    (r"\boxed{\sqrt{2}}", "1.4142136", 1.0),
    (r"\boxed{2\pi}", r"\pi \cdot 2", 1.0),
    (r"\boxed{\sqrt{8}}", r"2\sqrt{2}", 1.0),
    (r"\boxed{\sqrt{8}}", r"3\sqrt{2}", 0.0),
    (r"\boxed{e^{i\pi}}", "-1", 1.0),
    (r"\boxed{\sin^2 x + \cos^2 x}", "1", 1.0),
    (r"\boxed{\sqrt[3]{27}}", "3", 1.0),
    (r"\boxed{\frac{\pi}{3}}", r"60^\circ", 0.0),
    # ------------------------------------------------------------------ intervals and tuples
    (r"\boxed{(0, 1]}", "(0,1]", 1.0),
    (r"\boxed{[0, 1]}", "(0,1)", 0.0),
    (r"\boxed{(-\infty, 2)}", r"(-\infty,2)", 1.0),
    (r"\boxed{[1, \infty)}", r"x \in [1,\infty)", 1.0),
    (r"\boxed{(1,3) \cup (4, 5]}", r"(1,3)\cup(4,5]", 1.0),
    (r"\boxed{(1,3) \cup (4, 5]}", r"(1,3)\cup[4,5]", 0.0),
    (r"\boxed{(0, \frac{1}{2})}", "(0, 0.5)", 1.0),
    (r"\boxed{(2, 1)}", "(1, 2)", 0.0),
    # ------------------------------------------------------------------ lists and sets
    (r"\boxed{1, -2}", "-2, 1", 1.0),
    (r"\boxed{\{1, 2\}}", "2,1", 1.0),
    (r"\boxed{1, 2}", "1, 2, 3", 0.0),
    (r"The roots are \boxed{x=1, x=2}", "1,2", 1.0),
    # ------------------------------------------------------------------ words
    ("The answer is five.", "5", 1.0),
    ("The answer is twenty-one", "21", 1.0),
    (r"\boxed{\text{five}}", "5", 1.0),
    ("The answer is five.", "6", 0.0),
    (r"\boxed{\text{Tuesday}}", "tuesday", 1.0),
    (r"\boxed{\text{Tuesday}}", "Thursday", 0.0),
    # ------------------------------------------------------------------ labels
    (r"\boxed{3}", 3, 1.0),
    (r"\boxed{0.25}", 0.25, 1.0),
    (r"\boxed{\frac{1}{10}}", 0.1, 1.0),
    (r"\boxed{\frac{1}{3}}", 1 / 3, 1.0),
    (r"\boxed{1000001}", 1000000.0, 0.0),
    (r"\boxed{3}", 3.0, 1.0),
    (r"\boxed{4}", ["3", "4"], 1.0),
    (r"\boxed{5}", ["3", "4"], 0.0),
    (r"\boxed{4}", r"Adding, $2+2=4$, so the answer is $\boxed{4}$.", 1.0),
]


@pytest.fixture(scope="module")
def math_reward():
    config = make_config(plasmid_math.plugin, math_symbolic_timeout=10.0)
    reward = build("reward", "math", plasmid_math.plugin, config=config)
    yield reward
    reward.symbolic.close()


def test_there_are_at_least_sixty_hand_written_cases():
    assert len(CASES) >= 60


@pytest.mark.parametrize(("response", "label", "expected"), CASES)
def test_math_reward_scores_each_case(math_reward, response, label, expected):
    assert math_reward.score(response, label) == expected
