"""The assert verdict is made on the host, from values the guest cannot turn into a pass.

The guest is sent only the expressions to evaluate, never an expected value and never a way to
say "passed": a program that reads the harness (its stack frames, its files) and prints forged
markers earns nothing, and honest programs score exactly as Python would judge their asserts.
"""

from __future__ import annotations

import json

import plasmid_code.plugin
import pytest
from plasmid_code.verdict import decode, parse_replies, plan_snippet, snippet_passes

from plasmid.testing import build, make_config, run
from plasmid.types import Sample

ADD = "def add(a, b):\n    return a + b\n"


@pytest.fixture(scope="module")
def reward():
    return build("reward", "code", plasmid_code.plugin,
                 config=make_config(plasmid_code.plugin, code_timeout=3.0, code_concurrency=2))


def score(reward, program, asserts):
    return run(reward(Sample(response=program, label={"asserts": asserts})))


#: Reads the harness's frames (nonce, test list or plan, report descriptor), prints markers in
#: the old format and in the new one (claiming True for every expression), breaks the builtins
#: an assert relies on, and leaves before any test runs.
FRAME_ATTACK = """
import builtins, json, os, sys
found = {}
frame = sys._getframe(1)
while frame is not None:
    found.update(frame.f_locals)
    frame = frame.f_back
nonce = found.get("nonce", "")
tests = found.get("plan") or found.get("tests") or []
out = found.get("report", 1)
for i, steps in enumerate(tests):
    os.write(out, f"{nonce} passed {i}\\n".encode())
    steps = steps if isinstance(steps, list) else []
    claims = [None if isinstance(s, list) and s and s[0] == "exec" else True for s in steps]
    os.write(out, (nonce + " " + json.dumps({"i": i, "done": True, "r": claims}) + "\\n").encode())
builtins.AssertionError = type("Never", (BaseException,), {})
builtins.isinstance = lambda *a: True
os._exit(0)
"""


def test_the_stack_frame_attack_earns_nothing(reward):
    asserts = ["assert add(1, 2) == 3", "assert add(5, 5) == 10", "assert not is_even(3)",
               "assert add(1, 1) == 2 and not is_even(5)"]
    assert score(reward, FRAME_ATTACK, asserts) == 0.0
    honest = ADD + "def is_even(n):\n    return n % 2 == 0\n"
    assert score(reward, honest, asserts) == 1.0


def test_a_bare_truth_test_is_residual_and_no_weaker_than_a_constant_program(reward):
    """``assert is_even(4)`` has no expected value to keep: the guest's bool decides it, so a
    forged ``True`` passes it, exactly as ``return True`` would (see the README)."""
    constant = "def is_even(n):\n    return True\n"
    asserts = ["assert is_even(4)", "assert not is_even(3)"]
    assert score(reward, FRAME_ATTACK, asserts) == score(reward, constant, asserts) == 0.5


#: Looks for the expected value everywhere the harness could have left it: its frames, the files
#: of the sandbox directory, the program's stdin; answers with it when found.
EXPECTED_VALUE_HUNT = """
import gc, os, re, sys
seen = []
frame = sys._getframe(0)
while frame is not None:
    seen.extend(repr(value) for value in frame.f_locals.values())
    frame = frame.f_back
for name in os.listdir("."):
    try:
        seen.append(open(name, errors="replace").read())
    except OSError:
        pass
seen.extend(repr(obj) for obj in gc.get_objects() if isinstance(obj, (str, list, dict)))
NEEDLE = str(31330 + 7)  # never spelled out here: this source is in the harness's frames too
WHOLE = re.compile("(?<![0-9A-Za-z])" + NEEDLE + "(?![0-9A-Za-z])")  # not inside an address or a nonce
LEAKED = any(WHOLE.search(text) for text in seen)

def add(a, b):
    return int(NEEDLE) if LEAKED else a + b
"""


def test_the_expected_values_never_reach_the_guest(reward):
    assert score(reward, EXPECTED_VALUE_HUNT, ["assert add(1, 2) == 31337"]) == 0.0
    plan = plan_snippet("x = 1\nassert add(x, 2) == 31337 and add(0, 0) in (0, 31337)")
    assert "31337" not in json.dumps(plan.steps)


#: Snippets judged on the host compared with Python's own verdict (exec of program + snippet).
PROGRAM = ADD + """
import math
def pair(n):
    return (n, n)
def items(n):
    return list(range(n))
def none():
    return None
def boom():
    raise ValueError
def nan():
    return float("nan")
def empty():
    return []
class Point:
    def __init__(self, x):
        self.x = x
    def __eq__(self, other):
        return isinstance(other, Point) and other.x == self.x
"""
SNIPPETS = [
    "assert add(1, 2) == 3", "assert add(1, 2) == 4", "assert add(1, 2) != 4", "assert add(0.1, 0.2) == 0.1 + 0.2",
    "assert pair(1) == (1, 1)", "assert pair(1) == [1, 1]", "assert items(3) == [0, 1, 2]",
    "assert set(items(3)) == {0, 1, 2}", "assert frozenset(items(2)) == {0, 1}", "assert none() is None",
    "assert none() is not None", "assert add('a', 'b') == 'ab'", "assert add(b'a', b'b') == b'ab'",
    "assert add(2**80, 1) == 2**80 + 1", "assert 0 < add(1, 1) < 3", "assert 0 < add(1, 1) < 2",
    "assert add(1, 1) in [1, 2]", "assert add(1, 1) not in (1, 2)", "assert dict(a=add(1, 1)) == {'a': 2}",
    "assert not add(1, -1)", "assert add(1, 1)", "assert add(1, 1) == 2 and add(2, 2) == 4",
    "assert add(1, 1) == 2 and add(2, 2) == 5", "assert empty() == [] or empty()[0] == 1",
    "assert boom() == 1", "assert nan() != nan()", "assert math.isnan(nan())", "assert nan() == nan()",
    "x = items(4)\nx.append(9)\nassert x[-1] == 9\nassert len(x) == 5", "x = 1\nboom()\nassert x == 1",
    "assert Point(add(1, 1)) == Point(2)", "assert Point(1) == 1", "assert add(1, 2) == 3, 'message'",
    "assert abs(add(0.5, 0.25) - 0.75) < 1e-9", "assert add(1, 1) == 2 == 2.0", "assert add(True, 0) == 1",
    "assert add(1, 2) ==", "assert add(1j, 1) == 1 + 1j", "assert isinstance(add(1, 2), int)",
    "assert set(items(3)) == set((2, 1, 0))", "assert set(items(3)) == set([0, 1])",
    "assert sorted(items(3), reverse=True) == sorted([0, 1, 2], reverse=True)", "assert len(items(3)) == len('abc')",
    "assert add(0.5, 0.5) == float('1.0')", "from fractions import Fraction\nassert Fraction(add(1, 0), 2) == 0.5",
    "import decimal\nassert decimal.Decimal(add(1, 1)) == 2", "assert Fraction(1, 3) == 1 / 3",
    "assert add(1e308, 1e308) == float('inf')", "assert max(items(3)) == 2",
]


def python_verdicts(snippets):
    """Python's own verdicts: the program, then each snippet in its namespace, in order."""
    namespace = {"__name__": "solution"}
    exec(PROGRAM, namespace)
    verdicts = []
    for snippet in snippets:
        try:
            exec(snippet, namespace)
        except BaseException:  # noqa: BLE001 - a failing snippet, as the harness sees it
            verdicts.append(False)
        else:
            verdicts.append(True)
    return verdicts


def test_honest_programs_score_as_python_judges_their_asserts(reward):
    verdicts = run(reward.assert_verdicts(PROGRAM, SNIPPETS))
    expected = python_verdicts(SNIPPETS)
    assert [s for s, got, want in zip(SNIPPETS, verdicts, expected, strict=True) if got != want] == []
    assert 10 < sum(expected) < len(SNIPPETS) - 10  # both outcomes are well represented


def test_expected_values_built_with_builtins_stay_on_the_host(reward):
    """``set((4, 5))`` is computed here with the real ``set``: the guest is sent only ``set(f())``,
    and a program that shadows ``set`` (which would fool Python itself) changes only its own side."""
    plan = plan_snippet("assert set(f()) == set((4, 5))")
    assert plan.steps == [["value", "set(f())"]]
    shadowing = "set = lambda *args: 1\ndef f():\n    return [0]\n"
    assert score(reward, shadowing, ["assert set(f()) == set((4, 5))"]) == 0.0
    assert score(reward, "def f():\n    return [5, 4, 4]\n", ["assert set(f()) == set((4, 5))"]) == 1.0


def test_the_residual_forms_are_what_the_guest_decides():
    """Only comparisons with no host-side operand, and truth tests, go to the guest as bools."""
    plan = plan_snippet("assert f(x) == g(x)\nassert is_ok(1)\nassert f(1) == 2 or not h(3)")
    assert [kind for kind, _ in plan.steps] == ["truth", "truth", "value", "truth"]
    assert [source for _, source in plan.steps] == ["f(x) == g(x)", "is_ok(1)", "f(1)", "h(3)"]


@pytest.mark.parametrize("reply", [
    {"done": True, "r": [{"$": "tuple", "v": "3"}]},
    {"done": True, "r": [{"$": "nope"}]},
    {"done": True, "r": [{"no": "tag"}]},
    {"done": True, "r": [{"$": "opaque", "type": "X"}]},
    {"done": True, "r": [{"$": "error"}]},
    {"done": True, "r": [{"$": "int", "v": "zz"}]},
    {"done": True, "r": [json.loads("[" * 40 + "3" + "]" * 40)]},
    {"done": True, "r": [3, 3]},
    {"done": False, "r": [3]},
    {"done": "yes", "r": [3]},
    {"r": [3]},
    "3",
    None,
])
def test_a_malformed_or_undecidable_reply_fails_and_never_raises(reply):
    plan = plan_snippet("assert f() == 3")
    assert snippet_passes(plan, {"done": True, "r": [3]}) is True
    assert snippet_passes(plan, reply) is False


def test_replies_are_read_without_evaluating_anything():
    nonce = "n0nce"
    stdout = "\n".join([
        "n0nce " + json.dumps({"i": 0, "done": True, "r": [{"$": "float", "v": (0.5).hex()}]}),
        "n0nce {\"i\": 1, \"done\": true, \"r\": [NaN]}",
        "n0nce " + "[" * 100000 + "]" * 100000,
        "n0nce {\"i\": 2, \"r\": [" + "9" * 5000 + "]}",
        "someone else's line",
        "n0nce " + json.dumps({"i": 0, "done": True, "r": [1.5]}),
    ])
    replies = parse_replies(stdout, nonce)
    assert set(replies) == {0}
    assert decode(replies[0]["r"][0]) == 0.5
    with pytest.raises(ValueError):
        decode(json.loads("[" * 40 + "0" + "]" * 40))


#: A program that never computes the answer: what it returns claims to equal, be close to and be
#: less than anything, and it rebinds the built-ins a tolerance test relies on.
CLAIMS_EVERYTHING = """
import math
class Anything(float):
    def __eq__(self, other): return True
    __ne__ = __lt__ = __le__ = __gt__ = __ge__ = lambda self, other: True
    def __sub__(self, other): return Anything()
    __rsub__ = __add__ = __radd__ = __mul__ = __rmul__ = __truediv__ = __sub__
    def __abs__(self): return Anything()
    def __round__(self, digits=None): return Anything()
    def __bool__(self): return True
    def __hash__(self): return 0
abs = lambda value: 0
round = lambda value, digits=None: 0.75
math.isclose = lambda *args, **kwargs: True
def area(x):
    return Anything()
"""
TOLERANCE_AND_NESTED = [
    "assert abs(area(2) - 0.75) < 1e-9", "assert abs(0.75 - area(2)) <= 1e-6", "assert (area(2) == 0.75) == True",
    "assert (area(2) == 0.75) is True", "assert not (area(2) != 0.75)", "assert round(area(2), 2) == 0.75",
    "import math\nassert math.isclose(area(2), 0.75, rel_tol=1e-9)",
    "assert area(2) - 0.75 < 1e-9 and 0.75 - area(2) < 1e-9", "assert [area(2), 1] == [0.75, 1]",
]


def test_tolerance_and_nested_comparisons_are_decided_on_the_host(reward):
    """The guest returns ``area(2)`` as data; the host subtracts, takes ``abs``, rounds and compares
    with its own built-ins: neither the object nor the rebound built-ins decide anything."""
    assert score(reward, CLAIMS_EVERYTHING, TOLERANCE_AND_NESTED) == 0.0
    for honest in ("def area(x):\n    return 0.75 + 1e-12\n", "def area(x):\n    return 0.7\n"):
        verdicts = run(reward.assert_verdicts(honest, TOLERANCE_AND_NESTED))
        assert verdicts == [python_verdict(honest, snippet) for snippet in TOLERANCE_AND_NESTED]
    exact = "def area(x):\n    return 3 / 4\n"
    assert score(reward, exact, TOLERANCE_AND_NESTED) == 1.0
    for snippet in TOLERANCE_AND_NESTED:
        assert "0.75" not in json.dumps(plan_snippet(snippet).steps), snippet


def test_the_expected_value_of_a_tolerance_test_never_reaches_the_guest(reward):
    assert score(reward, EXPECTED_VALUE_HUNT, ["assert abs(add(1, 2) - 31337) < 0.5"]) == 0.0
    assert score(reward, EXPECTED_VALUE_HUNT, ["assert (add(1, 2) == 31337) == True"]) == 0.0


def python_verdict(program, snippet):
    namespace = {"__name__": "solution"}
    exec(program, namespace)
    try:
        exec(snippet, namespace)
    except BaseException:  # noqa: BLE001 - a failing snippet
        return False
    return True


def test_math_calls_on_the_host_still_need_the_name_in_the_guest(reward):
    """``math.isclose`` is applied on the host, but as in Python it fails where ``math`` is undefined."""
    program = "def area(x):\n    return 0.75\n"
    assert run(reward.assert_verdicts(program, ["assert math.isclose(area(2), 0.75)",
                                                "import math\nassert math.isclose(area(2), 0.75)"])) == [False, True]


@pytest.mark.parametrize("value", [
    {"$": "set", "v": [{"$": "int", "v": hex(k * (2**61 - 1))} for k in range(1, 20_000)]},
    {"$": "fraction", "v": [{"$": "int", "v": "f" * 200_000}, {"$": "int", "v": "e" * 200_000}]},
])
def test_decoding_a_hostile_value_is_refused_quickly(value):
    """20,000 ints with one hash (under 1 MB of output) took 3.8 s to make into a set."""
    import time
    started = time.perf_counter()
    assert snippet_passes(plan_snippet("assert f() == 3"), {"done": True, "r": [value]}) is False
    assert time.perf_counter() - started < 0.5
