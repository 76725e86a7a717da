"""The ``calculator`` tool: arithmetic expressions evaluated from their :mod:`ast`, never ``eval``.

Accepted: integer and float literals (integers stay exact, however large, within the digit
bound), ``+ - * / // % **``, unary ``+ -``, parentheses, the constants ``pi``, ``e`` and ``tau``,
and the functions of :data:`FUNCTIONS` called with positional numbers. Everything else (names,
attributes, subscripts, strings, comparisons, keyword arguments, ``^``, complex numbers) is
refused with a short reason, before anything is computed.

Bounds, so that no expression hangs or exhausts memory (see
:class:`~plasmid_basic_tools.options.CalculatorOptions`): the expression's length, its nesting
depth, the digits of every integer (literals and every intermediate result), the absolute value
of an integer exponent, and, before a power is computed, the digits its result would have.
Results must be finite real numbers. ``int / int`` that divides exactly is an exact integer
(``10**30 / 10**10`` is ``100000000000000000000``, not ``1e+20``); otherwise ``/`` is float
division as in Python.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any, ClassVar

from plasmid.config import Config
from plasmid.options import Options
from plasmid.protocols import ToolError
from plasmid.types import Sample
from plasmid_basic_tools.options import CalculatorOptions

Number = int | float

LOG10_2 = math.log10(2)

CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e, "tau": math.tau}


def _round(x: Number, ndigits: Number | None = None) -> Number:
    if ndigits is None:
        return round(x)
    if not isinstance(ndigits, int):
        raise ToolError("round: the number of digits must be an integer")
    return round(x, ndigits)


def _log(x: Number, base: Number | None = None) -> float:
    return math.log(x) if base is None else math.log(x, base)


#: name -> (function, fewest arguments, most arguments; None: any number).
FUNCTIONS: dict[str, tuple[Callable[..., Number], int, int | None]] = {
    "sqrt": (math.sqrt, 1, 1),
    "exp": (math.exp, 1, 1),
    "log": (_log, 1, 2),
    "log2": (math.log2, 1, 1),
    "log10": (math.log10, 1, 1),
    "sin": (math.sin, 1, 1),
    "cos": (math.cos, 1, 1),
    "tan": (math.tan, 1, 1),
    "abs": (abs, 1, 1),
    "round": (_round, 1, 2),
    "floor": (math.floor, 1, 1),
    "ceil": (math.ceil, 1, 1),
    "min": (min, 1, None),
    "max": (max, 1, None),
}

BINARY: dict[type[ast.operator], tuple[str, Callable[[Any, Any], Any]]] = {
    ast.Add: ("+", operator.add),
    ast.Sub: ("-", operator.sub),
    ast.Mult: ("*", operator.mul),
    ast.Div: ("/", operator.truediv),
    ast.FloorDiv: ("//", operator.floordiv),
    ast.Mod: ("%", operator.mod),
    ast.Pow: ("**", operator.pow),
}

UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _digits(value: int) -> int:
    """An estimate of the decimal digits of ``value``, one too many at most (cheap: no conversion
    to text)."""
    return int(abs(value).bit_length() * LOG10_2) + 1


def _more_digits_than(value: int, digits: int) -> bool:
    """Whether ``value`` has more than ``digits`` decimal digits (exactly, at little cost)."""
    estimate = _digits(value)
    if estimate <= digits:
        return False
    return estimate > digits + 1 or abs(value) >= 10**digits


class Evaluator:
    """Evaluates one parsed expression under the bounds of ``options`` (no state between calls)."""

    def __init__(self, options: CalculatorOptions) -> None:
        self.options = options

    def evaluate(self, expression: str) -> Number:
        """The value of ``expression``; :class:`ToolError` with a short reason if it is refused."""
        options = self.options
        if not expression.strip():
            raise ToolError("empty expression")
        if len(expression) > options.calculator_max_length:
            raise ToolError(f"expression too long ({len(expression)} characters; at most "
                            f"{options.calculator_max_length})")
        try:
            tree = ast.parse(expression.strip(), mode="eval")
        except SyntaxError as exc:
            raise ToolError(f"not an arithmetic expression ({exc.msg})") from None
        except (RecursionError, MemoryError, ValueError):
            raise ToolError("expression too deeply nested") from None
        self._check_depth(tree.body)
        try:
            value = self._eval(tree.body)
        except ToolError:
            raise
        except ZeroDivisionError:
            raise ToolError("division by zero") from None
        except OverflowError:
            raise ToolError("result too large") from None
        except (ValueError, TypeError) as exc:
            raise ToolError(f"math error ({exc})") from None
        return self._checked(value)

    def _check_depth(self, root: ast.AST) -> None:
        """Refuse trees nested deeper than ``--calculator-max-depth`` (iteratively, before any
        recursion)."""
        limit = self.options.calculator_max_depth
        stack = [(root, 1)]
        while stack:
            node, depth = stack.pop()
            if depth > limit:
                raise ToolError(f"expression too deeply nested (at most {limit} levels)")
            for child in ast.iter_child_nodes(node):
                # a chain such as 1 + 2 + ... + 9 nests on the left: it is flat (evaluated in a loop)
                flat = isinstance(node, ast.BinOp) and child is node.left
                stack.append((child, depth if flat else depth + 1))

    def _checked(self, value: Any) -> Number:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ToolError("the result is not a real number")
        if isinstance(value, float) and not math.isfinite(value):
            raise ToolError("the result is not a finite number")
        if isinstance(value, int) and _more_digits_than(value, self.options.calculator_max_digits):
            raise ToolError(f"result too large (more than {self.options.calculator_max_digits} digits)")
        return value

    def _eval(self, node: ast.AST) -> Number:
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, int | float):
                kind = "complex numbers" if isinstance(node.value, complex) else repr(node.value)
                raise ToolError(f"only numbers are allowed, not {kind}")
            return self._checked(node.value)
        if isinstance(node, ast.Name):
            if node.id in CONSTANTS:
                return CONSTANTS[node.id]
            hint = " (call it: name(...))" if node.id in FUNCTIONS else ""
            raise ToolError(f"unknown name {node.id!r}{hint}; constants: {', '.join(CONSTANTS)}")
        if isinstance(node, ast.UnaryOp):
            unary = UNARY.get(type(node.op))
            if unary is None:
                raise ToolError(f"operator {type(node.op).__name__} is not allowed")
            return self._checked(unary(self._eval(node.operand)))
        if isinstance(node, ast.BinOp):
            return self._binary(node)
        if isinstance(node, ast.Call):
            return self._call(node)
        raise ToolError(f"{_describe(node)} is not allowed; use numbers, + - * / // % **, parentheses and "
                        f"{', '.join(FUNCTIONS)}")

    def _binary(self, node: ast.BinOp) -> Number:
        """A left-nested chain of operations (``1 + 2 - 3 * 4``'s spine), evaluated in a loop."""
        chain = [node]
        while isinstance(left := chain[-1].left, ast.BinOp):
            chain.append(left)
        value = self._eval(left)
        for link in reversed(chain):
            value = self._operate(link.op, value, self._eval(link.right))
        return value

    def _operate(self, op: ast.operator, left: Number, right: Number) -> Number:
        entry = BINARY.get(type(op))
        if entry is None:
            if isinstance(op, ast.BitXor):
                raise ToolError("'^' is not allowed; write powers with **")
            raise ToolError(f"operator {type(op).__name__} is not allowed")
        symbol, function = entry
        if symbol == "**":
            self._check_power(left, right)
        elif symbol == "/" and isinstance(left, int) and isinstance(right, int) and right != 0 \
                and left % right == 0:
            return self._checked(left // right)
        return self._checked(function(left, right))

    def _check_power(self, base: Number, exponent: Number) -> None:
        """Refuse a power before computing it when its integer exponent or result is too large."""
        options = self.options
        if isinstance(exponent, int):
            if abs(exponent) > options.calculator_max_exponent:
                raise ToolError(f"exponent too large ({_short(exponent)}; at most {options.calculator_max_exponent})")
            if isinstance(base, int) and exponent > 0 and abs(base) > 1:
                digits = exponent * math.log10(abs(base))
                if digits > options.calculator_max_digits:
                    raise ToolError(f"result too large (about {int(digits) + 1} digits; at most "
                                    f"{options.calculator_max_digits})")
        if isinstance(base, int | float) and base < 0 and isinstance(exponent, float) and not exponent.is_integer():
            raise ToolError("a negative number to a fractional power is not a real number")

    def _call(self, node: ast.Call) -> Number:
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            raise ToolError(f"calling {_describe(node.func)} is not allowed; functions: {', '.join(FUNCTIONS)}")
        name = node.func.id
        if node.keywords:
            raise ToolError(f"{name}: keyword arguments are not allowed")
        if any(isinstance(arg, ast.Starred) for arg in node.args):
            raise ToolError(f"{name}: '*' arguments are not allowed")
        function, fewest, most = FUNCTIONS[name]
        if len(node.args) < fewest or (most is not None and len(node.args) > most):
            wanted = str(fewest) if fewest == most else f"{fewest} or more" if most is None else f"{fewest} to {most}"
            raise ToolError(f"{name} takes {wanted} argument{'s' if wanted != '1' else ''}, got {len(node.args)}")
        args = [self._eval(arg) for arg in node.args]
        if name == "round" and len(args) == 2 and isinstance(args[1], int) \
                and abs(args[1]) > self.options.calculator_max_digits:
            raise ToolError(f"round: at most {self.options.calculator_max_digits} digits")
        return self._checked(function(*args))


def _describe(node: ast.AST) -> str:
    """What ``node`` is, as a noun phrase for a message."""
    if isinstance(node, ast.Attribute):
        return f"attribute access ('.{node.attr}')"
    if isinstance(node, ast.Name):
        return f"{node.id!r}"
    return {
        ast.Subscript: "indexing", ast.Compare: "a comparison", ast.BoolOp: "'and'/'or'", ast.Lambda: "a lambda",
        ast.IfExp: "'if'", ast.List: "a list", ast.Tuple: "a tuple", ast.Dict: "a dict", ast.Set: "a set",
        ast.JoinedStr: "a string", ast.Call: "a call's result",
    }.get(type(node), type(node).__name__)


def _short(value: Number) -> str:
    text = str(value) if not isinstance(value, int) or _digits(value) <= 30 else f"~10**{_digits(value) - 1}"
    return text


def format_number(value: Number) -> str:
    """The tool's answer: an integer in full, a float in its shortest exact form (``repr``)."""
    return str(value) if isinstance(value, int) else repr(value)


class Calculator:
    """``await calculator({"expression": "2**10 / 3"}, sample)`` -> ``"341.3333333333333"``.

    Stateless, so concurrent calls are safe; each evaluation is bounded (see the module
    docstring) and quick, so it runs on the event loop.
    """

    name = "calculator"
    description = "Evaluate an arithmetic expression exactly: + - * / // % **, parentheses, sqrt, log, exp, " \
                  "sin, cos, abs, round, min, max, pi, e."
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "expression": {"type": "string", "description": "the expression, such as (3 + 4) * 2**10"},
        },
        "required": ["expression"],
        "additionalProperties": False,
    }
    option_classes: ClassVar[tuple[type[Options], ...]] = (CalculatorOptions,)

    def __init__(self, config: Config) -> None:
        """Built once per run as ``calculator(config)``, reading ``--calculator-*``."""
        self.evaluator = Evaluator(CalculatorOptions.of(config))

    def compute(self, expression: str) -> str:
        """The answer to ``expression`` as text (what a call returns); :class:`ToolError` if refused."""
        return format_number(self.evaluator.evaluate(expression))

    async def __call__(self, arguments: dict[str, Any], sample: Sample) -> str:
        expression = arguments.get("expression") if isinstance(arguments, dict) else None
        if not isinstance(expression, str):
            raise ToolError('give the expression as a string: {"expression": "..."}')
        extra = sorted(set(arguments) - {"expression"})
        if extra:
            raise ToolError(f"unknown argument{'s' if len(extra) > 1 else ''} {', '.join(map(repr, extra))}; "
                            f"give only \"expression\"")
        return self.compute(expression)
