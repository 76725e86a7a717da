"""Deciding assert-style tests on the trusted side, from values the guest cannot turn into a verdict.

The guest (untrusted: it runs the model's program) never sees an expected value and never says
"passed". For each test snippet the host parses it with :mod:`ast` (:func:`plan_snippet`):

- a top-level ``assert COND`` is split into a *skeleton* the host evaluates (``and``, ``or``,
  ``not``, comparisons, and every operand the host can compute safely: literals, arithmetic
  and containers of them, and a few pure built-ins applied to them, such as ``set((4, 5))``:
  the expected values) and *leaves* the guest evaluates (the sub-expressions
  that use names: ``add(1, 2)``). The guest is sent only the leaves' source text; it returns
  their values in the encoding below and the host makes the comparison;
- every other top-level statement (setup: imports, assignments, definitions, loops) runs in the
  guest, in order;
- a comparison with no host-side operand (``f(x) == g(x)``) and a bare truth test
  (``assert is_sorted(x)``) cannot be split: the guest evaluates it to a bool. That *residual*
  form is weaker: the program controls the value (see the plugin's README).

A snippet passes when the guest ran every setup statement without raising and every assert's
skeleton holds on the returned values. A leaf that raised, a value the host cannot compare (an
opaque object) or a malformed reply fails the assert.

The guest's encoding (:func:`decode`): JSON where ``None``, bools, strings, lists and small
ints are themselves and every other value is an object tagged ``"$"``: ``int`` (hex), ``float``
(``float.hex``), ``complex``, ``bytes`` (hex), ``tuple``, ``list``, ``set``, ``frozenset``,
``dict`` (a list of pairs), ``fraction``, ``decimal``, ``ellipsis``, ``opaque`` (any other
type: compares as nothing) and ``error`` (the leaf raised). Decoding never evaluates
anything; depth and size are capped.
"""

from __future__ import annotations

import ast
import decimal
import fractions
import json
import operator
from dataclasses import dataclass, field
from typing import Any

#: Nesting depth and number of items a decoded value may have (the guest caps the same).
MAX_DEPTH = 32
MAX_ITEMS = 100_000
#: Bounds of the host's own arithmetic on name-free expressions (``"ab" * 3``, ``2 ** 10``).
MAX_HOST_LENGTH = 100_000
MAX_HOST_BITS = 100_000
SINGLETONS = (None, True, False, Ellipsis)
#: Built-in functions the host applies itself to host-side values (``set((4, 5))``,
#: ``sorted([3, 1])``, ``float("inf")``), with the keywords each may take. The host uses the real
#: built-ins: a program that shadows ``set`` changes only its own side of a comparison.
HOST_CALLS: dict[str, tuple[Any, frozenset[str]]] = {
    name: (function, frozenset(keywords)) for name, function, keywords in [
        ("set", set, ()), ("frozenset", frozenset, ()), ("list", list, ()), ("tuple", tuple, ()),
        ("dict", dict, ()), ("sorted", sorted, ("reverse",)), ("len", len, ()), ("abs", abs, ()),
        ("min", min, ()), ("max", max, ()), ("sum", sum, ()), ("round", round, ()), ("int", int, ()),
        ("float", float, ()), ("complex", complex, ()), ("str", str, ()), ("bool", bool, ()),
    ]
}
COMPARE = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge, ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
    ast.Is: operator.is_, ast.IsNot: operator.is_not,
}


class Undecidable(Exception):
    """A value the host cannot judge: a leaf that raised, an opaque object, a malformed reply."""


class Opaque:
    """A guest value of a type the encoding does not carry: every comparison with it is undecidable."""

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name

    def _refuse(self, *args: object) -> bool:
        raise Undecidable(f"a value of type {self.type_name} cannot be compared on the host")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __contains__ = __hash__ = _refuse  # type: ignore[assignment]
    __bool__ = _refuse


# ---------------------------------------------------------------------------- the skeleton
@dataclass(frozen=True)
class Const:
    value: Any


@dataclass(frozen=True)
class Leaf:
    """The value of guest step ``index``; ``truth``: the step returns a bool (residual or truth test)."""

    index: int
    truth: bool = False


@dataclass(frozen=True)
class BoolOp:
    conjunction: bool
    parts: tuple


@dataclass(frozen=True)
class Not:
    part: Any


@dataclass(frozen=True)
class Compare:
    operands: tuple
    ops: tuple


@dataclass
class SnippetPlan:
    """What the guest runs for one snippet (``steps``: ``[kind, source]`` with kind ``exec``,
    ``value`` or ``truth``) and what the host checks (``checks``: one skeleton per assert)."""

    steps: list[list[str]] = field(default_factory=list)
    checks: list[Any] = field(default_factory=list)


_NOT_HOST = object()


def host_value(node: ast.expr) -> Any:
    """The value of ``node`` computed on the host, or ``_NOT_HOST`` when it uses names (or is too
    costly): literals, and name-free containers, unary and binary arithmetic of them and the
    :data:`HOST_CALLS` built-ins applied to them."""
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    try:
        return _arithmetic(node)
    except Exception:  # noqa: BLE001 - anything the host cannot compute safely goes to the guest
        return _NOT_HOST


def _arithmetic(node: ast.expr) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = [_arithmetic(item) for item in node.elts]
        return {ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(node)](items)
    if isinstance(node, ast.Dict) and None not in node.keys:
        return {_arithmetic(k): _arithmetic(v) for k, v in zip(node.keys, node.values, strict=True)}  # type: ignore[arg-type]
    if isinstance(node, ast.UnaryOp):
        operand = _arithmetic(node.operand)
        ops = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_, ast.Invert: operator.invert}
        return ops[type(node.op)](operand)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in HOST_CALLS:
        function, keywords = HOST_CALLS[node.func.id]
        if any(isinstance(arg, ast.Starred) for arg in node.args) or any(
                keyword.arg is None or (keyword.arg not in keywords and function is not dict)
                for keyword in node.keywords):
            raise ValueError("not a call the host makes")
        args = [_arithmetic(arg) for arg in node.args]
        if any(isinstance(arg, (str, bytes, list, tuple, set, frozenset, dict)) and len(arg) > MAX_HOST_LENGTH
               for arg in args):
            raise ValueError("too large")
        return function(*args, **{keyword.arg: _arithmetic(keyword.value) for keyword in node.keywords})
    if isinstance(node, ast.BinOp):
        left, right = _arithmetic(node.left), _arithmetic(node.right)
        if isinstance(node.op, ast.Pow) and isinstance(left, int) and isinstance(right, int):
            if right > 0 and max(abs(left), 2).bit_length() * right > MAX_HOST_BITS:
                raise ValueError("too large")
        if isinstance(node.op, ast.Mult):
            for seq, times in ((left, right), (right, left)):
                if isinstance(seq, (str, bytes, list, tuple)) and isinstance(times, int) and \
                        len(seq) * times > MAX_HOST_LENGTH:
                    raise ValueError("too large")
        ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
               ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
        return ops[type(node.op)](left, right)
    raise ValueError("not a name-free expression")


def plan_snippet(snippet: str) -> SnippetPlan | None:
    """The plan of one snippet, or None when it does not parse (it then fails)."""
    try:
        module = ast.parse(snippet)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    plan = SnippetPlan()
    pending: list[ast.stmt] = []

    def flush() -> None:
        if pending:
            plan.steps.append(["exec", ast.unparse(ast.Module(body=list(pending), type_ignores=[]))])
            pending.clear()

    for statement in module.body:
        if isinstance(statement, ast.Assert):
            flush()
            plan.checks.append(_skeleton(statement.test, plan))
        else:
            pending.append(statement)
    flush()
    return plan


def _guest_step(plan: SnippetPlan, node: ast.expr, truth: bool) -> Leaf:
    plan.steps.append(["truth" if truth else "value", ast.unparse(node)])
    return Leaf(len(plan.steps) - 1, truth)


def _skeleton(node: ast.expr, plan: SnippetPlan) -> Any:
    if isinstance(node, ast.BoolOp):
        return BoolOp(isinstance(node.op, ast.And), tuple(_skeleton(value, plan) for value in node.values))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return Not(_skeleton(node.operand, plan))
    value = host_value(node)
    if value is not _NOT_HOST:
        return Const(value)
    if isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
        values = [host_value(operand) for operand in operands]
        on_host = [value is not _NOT_HOST for value in values]
        identity_ok = all(
            not isinstance(op, (ast.Is, ast.IsNot))
            or any(on_host[i + j] and any(values[i + j] is s for s in SINGLETONS) for j in (0, 1))
            for i, op in enumerate(node.ops))
        if any(on_host) and identity_ok:
            parts = tuple(Const(value) if host else _guest_step(plan, operand, False)
                          for operand, value, host in zip(operands, values, on_host, strict=True))
            return Compare(parts, tuple(type(op) for op in node.ops))
    return _guest_step(plan, node, True)  # a truth test, or the residual form


# ---------------------------------------------------------------------------- the verdict
def holds(check: Any, results: list[Any]) -> bool:
    """Whether the skeleton ``check`` is true given the decoded guest ``results`` (short-circuit
    as Python would: a leaf that raised matters only when it is reached). Raises
    :class:`Undecidable` for a leaf that raised or cannot be compared."""
    if isinstance(check, Const):
        return bool(check.value)
    if isinstance(check, Leaf):
        value = _result(results, check)
        return bool(value)
    if isinstance(check, Not):
        return not holds(check.part, results)
    if isinstance(check, BoolOp):
        for part in check.parts:
            if holds(part, results) is not check.conjunction:
                return not check.conjunction
        return check.conjunction
    if isinstance(check, Compare):
        left = _operand(check.operands[0], results)
        for op, part in zip(check.ops, check.operands[1:], strict=True):
            right = _operand(part, results)
            outcome = COMPARE[op](left, right)
            if type(outcome) is not bool:
                raise Undecidable("a comparison gave a non-bool")
            if not outcome:
                return False
            left = right
        return True
    raise Undecidable(f"unknown check {check!r}")


def _operand(part: Any, results: list[Any]) -> Any:
    return part.value if isinstance(part, Const) else _result(results, part)


def _result(results: list[Any], leaf: Leaf) -> Any:
    if leaf.index >= len(results):
        raise Undecidable("missing result")
    value = results[leaf.index]
    if leaf.truth and type(value) is not bool:
        raise Undecidable("a truth step did not give a bool")
    return value


def snippet_passes(plan: SnippetPlan | None, reply: Any) -> bool:
    """The verdict on one snippet from its plan and the guest's reply ``{"done": bool, "r": [...]}``."""
    if plan is None or not isinstance(reply, dict) or reply.get("done") is not True:
        return False
    raw = reply.get("r")
    if not isinstance(raw, list) or len(raw) != len(plan.steps):
        return False
    try:
        budget = [MAX_ITEMS]
        results = [None if kind == "exec" else decode(item, budget=budget)
                   for (kind, _), item in zip(plan.steps, raw, strict=True)]
        return all(holds(check, results) for check in plan.checks)
    except (Undecidable, TypeError, ValueError, RecursionError, MemoryError, OverflowError, ArithmeticError):
        return False


class _Raised:
    """A leaf that raised in the guest."""

    def __bool__(self) -> bool:
        raise Undecidable("the expression raised in the guest")

    def _refuse(self, *args: object) -> bool:
        raise Undecidable("the expression raised in the guest")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __contains__ = __hash__ = _refuse  # type: ignore[assignment]


def decode(obj: Any, depth: int = 0, budget: list[int] | None = None) -> Any:
    """A guest value from its JSON form (see the module docstring); raises ``ValueError`` on
    anything malformed. Nothing is evaluated; depth and item count are capped."""
    budget = budget if budget is not None else [MAX_ITEMS]
    budget[0] -= 1
    if depth > MAX_DEPTH or budget[0] < 0:
        raise ValueError("value too deep or too large")
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return obj
    if isinstance(obj, list):
        return [decode(item, depth + 1, budget) for item in obj]
    if not isinstance(obj, dict) or not isinstance(obj.get("$"), str):
        raise ValueError(f"malformed value {obj!r:.60}")
    tag, value = obj["$"], obj.get("v")

    def items() -> list[Any]:
        if not isinstance(value, list):
            raise ValueError(f"malformed {tag}")
        return [decode(item, depth + 1, budget) for item in value]

    def text() -> str:
        if not isinstance(value, str):
            raise ValueError(f"malformed {tag}")
        return value

    if tag == "int":
        return int(text(), 16)
    if tag == "float":
        return float.fromhex(text())
    if tag == "complex":
        if not (isinstance(value, list) and len(value) == 2 and all(isinstance(part, str) for part in value)):
            raise ValueError("malformed complex")
        return complex(float.fromhex(value[0]), float.fromhex(value[1]))
    if tag == "bytes":
        return bytes.fromhex(text())
    if tag == "tuple":
        return tuple(items())
    if tag == "set":
        return set(items())
    if tag == "frozenset":
        return frozenset(items())
    if tag == "dict":
        pairs = items()
        if not all(isinstance(pair, list) and len(pair) == 2 for pair in pairs):
            raise ValueError("malformed dict")
        return {key: item for key, item in pairs}
    if tag == "fraction":
        parts = items()
        if len(parts) != 2 or not all(type(part) is int for part in parts):
            raise ValueError("malformed fraction")
        return fractions.Fraction(parts[0], parts[1])
    if tag == "decimal":
        if len(text()) > 1000:
            raise ValueError("decimal too long")
        return decimal.Decimal(text())
    if tag == "ellipsis":
        return Ellipsis
    if tag == "opaque":
        return Opaque(str(obj.get("type", "?"))[:64])
    if tag == "error":
        return _Raised()
    raise ValueError(f"unknown tag {tag!r:.40}")


def parse_replies(stdout: str, nonce: str) -> dict[int, Any]:
    """The guest's replies by snippet index: lines ``NONCE {"i": I, ...}``; the first per index
    counts, anything else (the program's own output, a truncated line) is ignored."""
    replies: dict[int, Any] = {}
    prefix = nonce + " "
    for line in stdout.splitlines():
        if not line.startswith(prefix):
            continue
        try:
            reply = json.loads(line[len(prefix):], parse_constant=_no_constant)
        except (ValueError, RecursionError):
            continue
        index = reply.get("i") if isinstance(reply, dict) else None
        if type(index) is int and index not in replies:
            replies[index] = reply
    return replies


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")
