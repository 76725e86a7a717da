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
import math
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


@dataclass(frozen=True)
class Arith:
    """A binary (``right`` set) or unary operator applied on the host to host values."""

    op: type
    left: Any
    right: Any = None


@dataclass(frozen=True)
class Call:
    """A :data:`HOST_CALLS` or :data:`MATH_CALLS` function applied on the host; ``resolve``: the
    guest step that must evaluate the function's name without raising (``math.isclose`` where
    the program never imported ``math`` fails, as in Python)."""

    function: Any
    args: tuple
    keywords: tuple
    resolve: Any = None


@dataclass(frozen=True)
class Display:
    """A tuple, list, set or dict display built on the host (``keys`` set for a dict)."""

    kind: type
    items: tuple
    keys: tuple | None = None


@dataclass
class SnippetPlan:
    """What the guest runs for one snippet (``steps``: ``[kind, source]`` with kind ``exec``,
    ``value`` or ``truth``) and what the host checks (``checks``: one skeleton per assert)."""

    steps: list[list[str]] = field(default_factory=list)
    checks: list[Any] = field(default_factory=list)


_NOT_HOST = object()
ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
              ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_, ast.Invert: operator.invert}
#: ``math`` functions the host applies itself (the common tolerance and float checks).
MATH_CALLS: dict[str, tuple[Any, frozenset[str]]] = {
    "isclose": (math.isclose, frozenset({"rel_tol", "abs_tol"})), "isnan": (math.isnan, frozenset()),
    "isinf": (math.isinf, frozenset()), "isfinite": (math.isfinite, frozenset()), "fabs": (math.fabs, frozenset()),
    "floor": (math.floor, frozenset()), "ceil": (math.ceil, frozenset()), "sqrt": (math.sqrt, frozenset()),
}
#: At most this many items of a set, frozenset or dict the host builds may share one hash (more
#: is a collision attack that would make building it quadratic).
MAX_SAME_HASH = 64


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
        return _build({ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(node)], items)
    if isinstance(node, ast.Dict) and None not in node.keys:
        return _build(dict, [(_arithmetic(k), _arithmetic(v)) for k, v in zip(node.keys, node.values, strict=True)])  # type: ignore[arg-type]
    if isinstance(node, ast.UnaryOp):
        return _unary(type(node.op), _arithmetic(node.operand))
    call = _host_call(node)
    if call is not None:
        function, _ = call
        return _apply(function, [_arithmetic(arg) for arg in node.args],  # type: ignore[attr-defined]
                      {keyword.arg: _arithmetic(keyword.value) for keyword in node.keywords})  # type: ignore[attr-defined]
    if isinstance(node, ast.BinOp):
        return _binary(type(node.op), _arithmetic(node.left), _arithmetic(node.right), trusted_left=True)
    raise ValueError("not a name-free expression")


def _host_call(node: ast.expr) -> tuple[Any, bool] | None:
    """``(function, from math)`` when ``node`` is a call the host makes itself, else None."""
    if not isinstance(node, ast.Call) or any(isinstance(arg, ast.Starred) for arg in node.args):
        return None
    func = node.func
    if isinstance(func, ast.Name) and func.id in HOST_CALLS:
        function, keywords = HOST_CALLS[func.id]
        from_math = False
    elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "math" and \
            func.attr in MATH_CALLS:
        function, keywords = MATH_CALLS[func.attr]
        from_math = True
    else:
        return None
    if any(keyword.arg is None or (keyword.arg not in keywords and function is not dict) for keyword in node.keywords):
        return None
    return function, from_math


# ---------------------------------------------------------------------------- host operations
def _plain(*values: Any) -> None:
    for value in values:
        if isinstance(value, (Opaque, _Raised)):
            raise Undecidable("an operand is not a value the host can compute with")


def _too_big(value: Any) -> bool:
    if isinstance(value, int):
        return value.bit_length() > MAX_HOST_BITS
    if isinstance(value, fractions.Fraction):
        return _too_big(value.numerator) or _too_big(value.denominator)
    if isinstance(value, (str, bytes, list, tuple, set, frozenset, dict)):
        return len(value) > MAX_HOST_LENGTH
    return False


def _binary(op: type, left: Any, right: Any, trusted_left: bool = False) -> Any:
    """``left OP right`` on host values, refused (``ValueError``) where it would be costly: big
    integers, long sequences, powers and repetitions past the bounds, and ``%`` formatting with
    a format string that is not the test's own."""
    _plain(left, right)
    if _too_big(left) or _too_big(right):
        raise ValueError("too large")
    if op is ast.Pow and isinstance(right, int) and isinstance(left, (int, fractions.Fraction)) and right > 0:
        base = left if isinstance(left, int) else max(abs(left.numerator), left.denominator)
        if max(abs(base), 2).bit_length() * right > MAX_HOST_BITS:
            raise ValueError("too large")
    if op is ast.Pow and isinstance(left, decimal.Decimal | fractions.Fraction) and not isinstance(right, int):
        raise ValueError("not a power the host computes")
    if op is ast.Mult:
        for seq, times in ((left, right), (right, left)):
            if isinstance(seq, (str, bytes, list, tuple)) and isinstance(times, int) and \
                    len(seq) * times > MAX_HOST_LENGTH:
                raise ValueError("too large")
    if op is ast.Mod and isinstance(left, (str, bytes)) and not trusted_left:
        raise ValueError("formatting with a guest's format string")
    return ARITHMETIC[op](left, right)


def _unary(op: type, operand: Any) -> Any:
    _plain(operand)
    return UNARY[op](operand)


def _build(kind: type, items: list[Any]) -> Any:
    """``kind(items)`` for a host container (``items``: pairs for a dict), its hashes bounded."""
    if kind in (set, frozenset, dict):
        _bounded_hashes([item[0] for item in items] if kind is dict else items)
    return kind(items)


def _bounded_hashes(items: Any) -> None:
    counts: dict[int, int] = {}
    for item in items:
        _plain(item)
        key = hash(item)
        counts[key] = counts.get(key, 0) + 1
        if counts[key] > MAX_SAME_HASH:
            raise ValueError("too many items with one hash")


def _apply(function: Any, args: list[Any], keywords: dict[str, Any]) -> Any:
    _plain(*args, *keywords.values())
    if any(_too_big(arg) for arg in (*args, *keywords.values())):
        raise ValueError("too large")
    if function in (set, frozenset, dict) and args and isinstance(args[0], (list, tuple, set, frozenset, dict)):
        _bounded_hashes(args[0].keys() if isinstance(args[0], dict) else
                        [pair[0] for pair in args[0] if isinstance(pair, (list, tuple)) and pair]
                        if function is dict else args[0])
    if function is round and len(args) == 2 and isinstance(args[1], int) and abs(args[1]) > 10_000:
        raise ValueError("too many digits")
    return function(*args, **keywords)


# ---------------------------------------------------------------------------- planning
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

    try:
        for statement in module.body:
            if isinstance(statement, ast.Assert):
                flush()
                plan.checks.append(_skeleton(statement.test, plan, truth=True))
            else:
                pending.append(statement)
        flush()
    except (RecursionError, MemoryError):
        return None
    return plan


def _guest_step(plan: SnippetPlan, node: ast.expr, truth: bool) -> Leaf:
    plan.steps.append(["truth" if truth else "value", ast.unparse(node)])
    return Leaf(len(plan.steps) - 1, truth)


def _operands(node: ast.expr) -> list[ast.expr] | None:
    """The operands of ``node`` when the host can apply its operation itself (arithmetic, a host
    call, a display, a comparison, ``and``/``or``/``not``), else None."""
    if isinstance(node, ast.BinOp) and type(node.op) in ARITHMETIC:
        return [node.left, node.right]
    if isinstance(node, ast.UnaryOp):
        return [node.operand]
    if _host_call(node) is not None:
        return [*node.args, *(keyword.value for keyword in node.keywords)]  # type: ignore[attr-defined]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and \
            not any(isinstance(item, ast.Starred) for item in node.elts):
        return list(node.elts)
    if isinstance(node, ast.Dict) and None not in node.keys:
        return [*node.keys, *node.values]  # type: ignore[list-item]
    if isinstance(node, ast.Compare):
        return [node.left, *node.comparators]
    if isinstance(node, ast.BoolOp):
        return list(node.values)
    return None


def _holds_expected(node: ast.expr) -> bool:
    """Whether ``node`` has a name-free operand (an expected value, a tolerance) within the
    operations the host applies itself: then it is taken apart so that the guest never receives
    that value, and no guest object is asked to combine itself with it."""
    operands = _operands(node)
    if operands is None:
        return False
    return any(host_value(operand) is not _NOT_HOST or _holds_expected(operand) for operand in operands)


def _skeleton(node: ast.expr, plan: SnippetPlan, truth: bool) -> Any:
    """The host's part of ``node``: what it computes itself over the values of guest steps.

    A sub-expression with a name-free operand inside the host's operations (``abs(f(x) - 0.5)``,
    ``(f(x) == 3) == True``, ``round(f(x), 2)``) is taken apart down to the sub-expressions that
    hold none (``f(x)``), which become guest steps; one that holds none (``sorted(f(x))``) is a
    single step, whose value comes back as data. Only comparisons with no host-side operand and
    bare truth tests are decided by a value of the guest (the residual form)."""
    value = host_value(node)
    if value is not _NOT_HOST:
        return Const(value)
    if isinstance(node, ast.BoolOp):
        return BoolOp(isinstance(node.op, ast.And), tuple(_skeleton(part, plan, truth) for part in node.values))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return Not(_skeleton(node.operand, plan, True))
    if isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
        on_host = [host_value(operand) is not _NOT_HOST or _holds_expected(operand) for operand in operands]
        identity_ok = all(
            not isinstance(op, (ast.Is, ast.IsNot))
            or any(on_host[i + j] and any(host_value(operands[i + j]) is s for s in SINGLETONS) for j in (0, 1))
            for i, op in enumerate(node.ops))
        if any(on_host) and identity_ok:
            return Compare(tuple(_skeleton(operand, plan, False) for operand in operands),
                           tuple(type(op) for op in node.ops))
        return _guest_step(plan, node, truth)  # the residual form
    if _holds_expected(node):
        if isinstance(node, ast.BinOp):
            return Arith(type(node.op), _skeleton(node.left, plan, False), _skeleton(node.right, plan, False))
        if isinstance(node, ast.UnaryOp):
            return Arith(type(node.op), _skeleton(node.operand, plan, False))
        call = _host_call(node)
        if call is not None:
            assert isinstance(node, ast.Call)
            function, from_math = call
            resolve = _guest_step(plan, node.func, False) if from_math else None
            return Call(function, tuple(_skeleton(arg, plan, False) for arg in node.args),
                        tuple((keyword.arg, _skeleton(keyword.value, plan, False)) for keyword in node.keywords),
                        resolve)
        if isinstance(node, ast.Dict):
            return Display(dict, tuple(_skeleton(item, plan, False) for item in node.values),
                           tuple(_skeleton(key, plan, False) for key in node.keys))  # type: ignore[arg-type]
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            kind = {ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(node)]
            return Display(kind, tuple(_skeleton(item, plan, False) for item in node.elts))
    return _guest_step(plan, node, truth)  # a truth test, or a value the guest computes alone


# ---------------------------------------------------------------------------- the verdict
def holds(check: Any, results: list[Any]) -> bool:
    """Whether the skeleton ``check`` is true given the decoded guest ``results`` (short-circuit
    as Python would: a leaf that raised matters only when it is reached). Raises
    :class:`Undecidable` for a leaf that raised or cannot be compared."""
    return _truth(evaluate(check, results))


def _truth(value: Any) -> bool:
    _plain(value)
    return bool(value)


def evaluate(check: Any, results: list[Any]) -> Any:
    """The value of the skeleton ``check`` on the host (see :func:`holds`)."""
    if isinstance(check, Const):
        return check.value
    if isinstance(check, Leaf):
        return _result(results, check)
    if isinstance(check, Not):
        return not _truth(evaluate(check.part, results))
    if isinstance(check, BoolOp):
        value: Any = check.conjunction
        for part in check.parts:
            value = evaluate(part, results)
            if _truth(value) is not check.conjunction:
                return value
        return value
    if isinstance(check, Compare):
        left = evaluate(check.operands[0], results)
        for op, part in zip(check.ops, check.operands[1:], strict=True):
            right = evaluate(part, results)
            _plain(left, right)
            outcome = COMPARE[op](left, right)
            if type(outcome) is not bool:
                raise Undecidable("a comparison gave a non-bool")
            if not outcome:
                return False
            left = right
        return True
    if isinstance(check, Arith):
        if check.right is None:
            return _unary(check.op, evaluate(check.left, results))
        return _binary(check.op, evaluate(check.left, results), evaluate(check.right, results),
                       trusted_left=isinstance(check.left, Const))
    if isinstance(check, Call):
        if check.resolve is not None and isinstance(_result(results, check.resolve), _Raised):
            raise Undecidable("the function's name raised in the guest")
        return _apply(check.function, [evaluate(arg, results) for arg in check.args],
                      {name: evaluate(part, results) for name, part in check.keywords})
    if isinstance(check, Display):
        items = [evaluate(item, results) for item in check.items]
        if check.keys is not None:
            return _build(dict, list(zip([evaluate(key, results) for key in check.keys], items, strict=True)))
        return _build(check.kind, items)
    raise Undecidable(f"unknown check {check!r}")


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
        return _build(set, items())
    if tag == "frozenset":
        return _build(frozenset, items())
    if tag == "dict":
        pairs = items()
        if not all(isinstance(pair, list) and len(pair) == 2 for pair in pairs):
            raise ValueError("malformed dict")
        return _build(dict, [(key, item) for key, item in pairs])
    if tag == "fraction":
        parts = items()
        if len(parts) != 2 or not all(type(part) is int and not _too_big(part) for part in parts):
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
