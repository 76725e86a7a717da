"""The calculator evaluates arithmetic exactly from the expression's syntax tree, and refuses,
quickly and with a short ToolError, anything else: names, attributes, calls other than its math
functions, and expressions whose size, depth or results would hang or exhaust memory."""

from __future__ import annotations

import time

import plasmid_basic_tools.plugin
import pytest
from plasmid_basic_tools.calculator import Calculator

from plasmid.protocols import Tool, ToolError
from plasmid.testing import build, make_config, run
from plasmid.types import Sample


@pytest.fixture(scope="module")
def calculator() -> Calculator:
    return build("tool", "calculator", plasmid_basic_tools.plugin)


def call(tool: Calculator, expression: str) -> str:
    return run(tool({"expression": expression}, Sample()))


def test_it_is_a_tool_with_a_one_line_description_and_a_schema(calculator):
    assert isinstance(calculator, Tool) and calculator.name == "calculator"
    assert calculator.description and "\n" not in calculator.description
    assert calculator.parameters["type"] == "object"
    assert calculator.parameters["required"] == ["expression"]
    assert calculator.parameters["properties"]["expression"]["type"] == "string"


@pytest.mark.parametrize(("expression", "answer"), [
    ("1 + 2 * 3", "7"),
    ("(1 + 2) * 3", "9"),
    ("2**10 / 3", "341.3333333333333"),
    ("7 // 2", "3"),
    ("-7 % 3", "2"),
    ("2 ** 3 ** 2", "512"),
    ("-3 ** 2", "-9"),
    ("+-+4", "-4"),
    ("2 ** -2", "0.25"),
    ("0.1 + 0.2", "0.30000000000000004"),
    ("1e3 * 2", "2000.0"),
    ("123456789123456789 * 987654321987654321", str(123456789123456789 * 987654321987654321)),
    ("2 ** 200", str(2**200)),
    ("10**30 / 10**10", "100000000000000000000"),
    ("7 / 2", "3.5"),
    ("sqrt(16)", "4.0"),
    ("log(8, 2)", "3.0"),
    ("log(e)", "1.0"),
    ("exp(0)", "1.0"),
    ("sin(0) + cos(0)", "1.0"),
    ("abs(-5)", "5"),
    ("round(2.567, 2)", "2.57"),
    ("round(2.5)", "2"),
    ("min(3, 1, 2) + max(4, 5)", "6"),
    ("pi", repr(3.141592653589793)),
    (" 1 + 1 ", "2"),
    ("(" * 100 + "1" + ")" * 100, "1"),
    ("10 ** 999 * 9", "9" + "0" * 999),
    ("+".join(map(str, range(250))), str(sum(range(250)))),
])
def test_arithmetic_is_evaluated_as_python_does_and_exactly_for_integers(calculator, expression, answer):
    assert call(calculator, expression) == answer


@pytest.mark.parametrize(("expression", "reason"), [
    ("9**9**9", "exponent too large"),
    ("2 ** 100000", "exponent too large"),
    ("10 ** 5000", "result too large"),
    ("(10**500) * (10**500) * 10", "result too large"),
    ("7 ** 7 ** 7", "exponent too large"),
    ("__import__('os').system('true')", "calling attribute access ('.system') is not allowed"),
    ("__import__('os')", "calling '__import__' is not allowed"),
    ("__import__", "unknown name"),
    ("(1).__class__", "attribute access"),
    ("().__class__.__bases__[0].__subclasses__()", "not allowed"),
    ("[1, 2][0]", "not allowed"),
    ("'a' * 10", "only numbers"),
    ("x + 1", "unknown name 'x'"),
    ("sqrt", "unknown name 'sqrt' (call it"),
    ("open('/etc/passwd')", "calling 'open' is not allowed"),
    ("lambda: 1", "lambda"),
    ("1 if 1 else 2", "not allowed"),
    ("1 < 2", "comparison"),
    ("2 ^ 3", "write powers with **"),
    ("1 << 3", "not allowed"),
    ("1j", "complex"),
    ("True + 1", "only numbers"),
    ("round(5, -100000)", "round: at most"),
    ("sqrt(x=4)", "keyword arguments"),
    ("sqrt(1, 2)", "sqrt takes 1 argument, got 2"),
    ("max()", "max takes 1 or more arguments"),
    ("1 / 0", "division by zero"),
    ("5 % 0", "division by zero"),
    ("sqrt(-1)", "math error"),
    ("log(0)", "math error"),
    ("exp(1000)", "result too large"),
    ("1e308 * 10", "not a finite number"),
    ("(-8) ** 0.5", "not a real number"),
    ("1 +", "not an arithmetic expression"),
    ("", "empty expression"),
    ("import os", "not an arithmetic expression"),
    ("1; 2", "not an arithmetic expression"),
    ("-" * 60 + "1", "too deeply nested"),
    ("(" * 250 + "1" + ")" * 250, "not an arithmetic expression"),
    ("sqrt(" * 60 + "1" + ")" * 60, "too deeply nested"),
    ("1" + "+1" * 2000, "too long"),
    ("9" * 1001, "too long"),
])
def test_hostile_and_wrong_inputs_are_a_short_tool_error(calculator, expression, reason):
    started = time.perf_counter()
    with pytest.raises(ToolError) as raised:
        call(calculator, expression)
    assert reason in str(raised.value)
    assert "\n" not in str(raised.value) and len(str(raised.value)) < 300
    assert time.perf_counter() - started < 2.0


@pytest.mark.parametrize("arguments", [{}, {"expression": 3}, {"expr": "1"}, {"expression": "1", "x": 1}])
def test_wrong_arguments_are_a_tool_error(calculator, arguments):
    with pytest.raises(ToolError):
        run(calculator(arguments, Sample()))


def test_the_bounds_are_the_options():
    config = make_config(plasmid_basic_tools.plugin, calculator_max_digits=10, calculator_max_exponent=5,
                         calculator_max_length=20, calculator_max_depth=3)
    tool = build("tool", "calculator", plasmid_basic_tools.plugin, config=config)
    assert call(tool, "99999 * 99999") == "9999800001"
    with pytest.raises(ToolError, match="more than 10 digits"):
        call(tool, "99999 * 999999")
    assert call(tool, "2 ** 5") == "32"
    with pytest.raises(ToolError, match="at most 5"):
        call(tool, "2 ** 6")
    with pytest.raises(ToolError, match="at most 20"):
        call(tool, "1 + 1 + 1 + 1 + 1 + 1")
    assert call(tool, "-(-(1))") == "1"
    with pytest.raises(ToolError, match="at most 3 levels"):
        call(tool, "-(-(-(1)))")


def test_concurrent_calls_share_one_calculator(calculator):
    import asyncio

    async def many():
        return await asyncio.gather(*(calculator({"expression": f"{i} * {i}"}, Sample()) for i in range(50)))

    assert run(many()) == [str(i * i) for i in range(50)]
