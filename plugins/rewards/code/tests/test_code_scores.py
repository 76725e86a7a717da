"""The code reward scores the fraction of the label's tests that the response's program passes."""

from __future__ import annotations

import json

import plasmid_code.plugin
import pytest
from plasmid_code.extract import extract_code
from plasmid_code.labels import LabelError, parse_label, same_output

from plasmid.testing import RewardContract, build, make_config, run
from plasmid.types import Sample

ADD_LABEL = {
    "tests": [{"stdin": "1 2\n", "stdout": "3\n"}, {"stdin": "5 7\n", "stdout": "12"}],
    "asserts": ["assert add(1, 2) == 3", "assert add(2, 0) == 2"],
}
ADD_PROGRAM = """def add(a, b):
    return a + b

if __name__ == "__main__":
    a, b = map(int, input().split())
    print(add(a, b))
"""


def code_reward(**options):
    options.setdefault("code_timeout", 2.0)
    config = make_config(plasmid_code.plugin, **options)
    return build("reward", "code", plasmid_code.plugin, config=config)


@pytest.fixture(scope="module")
def reward():
    return code_reward()


def score(reward, response, label=None):
    return run(reward(Sample(response=response, label=ADD_LABEL if label is None else label)))


class TestCodeContract(RewardContract):
    plugin = plasmid_code.plugin
    provider = "code"
    config_options = {"code_timeout": 2.0}
    concurrency = 2
    cases = [
        (f"```python\n{ADD_PROGRAM}```", ADD_LABEL),
        ("print(3)", {"tests": [{"stdin": "", "stdout": "3"}]}),
        ("def add(a, b): return a - b", json.dumps({"asserts": ["assert add(1, 1) == 0", "assert add(1, 2) == 3"]})),
        ("no code here", {"tests": [{"stdin": "", "stdout": "x"}]}),
    ]


SCORES = [
    # (what, response, expected score)
    ("a correct program in a python fence", f"Here it is:\n```python\n{ADD_PROGRAM}```\nDone.", 1.0),
    ("a correct bare program", ADD_PROGRAM, 1.0),
    ("an untagged fence", f"```\n{ADD_PROGRAM}```", 1.0),
    ("the last python fence wins", f"```python\nprint(0)\n```\n```python\n{ADD_PROGRAM}```", 1.0),
    ("a fence cut off by the length limit", f"```python\n{ADD_PROGRAM}", 1.0),
    ("subtraction passes only add(2, 0) == 2 among the asserts", ADD_PROGRAM.replace("a + b", "a - b").replace(
        "print(add(a, b))", "print(a + b)"), 0.75),
    ("functions only: the asserts pass, stdin tests print nothing", "def add(a, b):\n    return a + b\n", 0.5),
    ("a constant output passes one stdin test", "print(3)", 0.25),
    ("a syntax error passes nothing", "def add(a, b) return a + b", 0.0),
    ("an exception after the right output fails", "print(3)\nraise SystemExit(1)", 0.0),
    ("no code", "", 0.0),
    ("sys.exit(0) before the asserts passes none of them", "import sys\ndef add(a, b): return a + b\nsys.exit(0)",
     0.0),
]


@pytest.mark.parametrize(("what", "response", "expected"), SCORES, ids=[case[0] for case in SCORES])
def test_scores_are_the_fraction_of_tests_passed(reward, what, response, expected):
    assert score(reward, response) == pytest.approx(expected), what


def test_asserts_after_a_hanging_one_fail_and_earlier_ones_count():
    reward = code_reward(code_timeout=1.0)
    label = {"asserts": ["assert f() == 1", "assert g() == 2", "assert f() == 1"]}
    program = "def f(): return 1\ndef g():\n    while True: pass\n"
    assert score(reward, program, label) == pytest.approx(1 / 3)


def test_printing_the_markers_does_not_pass_asserts(reward):
    forged = "import sys\nfor i in range(3): print(f'deadbeef passed {i}')\nsys.exit(0)"
    assert score(reward, forged, {"asserts": ["assert False", "assert False"]}) == 0.0


def test_a_label_in_the_wrong_format_is_an_error_naming_the_format(reward):
    with pytest.raises(LabelError, match="expected"):
        score(reward, "print(1)", {"inputs": ["1"]})
    with pytest.raises(LabelError, match="no tests"):
        score(reward, "print(1)", {"tests": []})
    with pytest.raises(LabelError, match="not JSON"):
        score(reward, "print(1)", "tests: 3")


def test_labels_parse_from_dicts_and_json_strings():
    suite = parse_label(json.dumps(ADD_LABEL), "here")
    assert suite.size == 4 and suite.stdio[1].stdout == "12" and suite.asserts[0] == "assert add(1, 2) == 3"
    assert parse_label({"tests": [{"stdout": "x"}]}, "here").stdio[0].stdin == ""


@pytest.mark.parametrize(("actual", "expected", "same"), [
    ("3\n", "3", True), ("3  \n\n\n", "3", True), ("a\r\nb\n", "a\nb", True),
    ("3", "4", False), (" 3", "3", False), ("a\n\nb", "a\nb", False),
])
def test_outputs_compare_ignoring_trailing_whitespace_only(actual, expected, same):
    assert same_output(actual, expected) is same


@pytest.mark.parametrize(("response", "code"), [
    ("```python\nA\n```", "A\n"),
    ("```py\nA\n```\ntext\n```python3\nB\n```", "B\n"),
    ("```python\nA\n```\n```\nB\n```", "A\n"),
    ("```\nB\n```", "B\n"),
    ("print(1)", "print(1)"),
    ("```python\nA", "A"),
])
def test_the_program_is_the_last_python_fence_else_untagged_else_everything(response, code):
    assert extract_code(response) == code


@pytest.mark.parametrize("response", [
    "```" + "a" * 100_000, "```python " + "x" * 100_000, "```" * 40_000, ("```py\n" + "a" * 50 + "```") * 3_000 + "```",
])
def test_finding_the_program_takes_linear_time(response):
    import time
    started = time.perf_counter()
    extract_code(response)
    assert time.perf_counter() - started < 0.2
