"""Deciding whether an answer equals a reference answer.

Both are normalised (:func:`plasmid_math.normalize.normalize`) and compared, in order:

1. as text: equal normalised strings are equal;
2. by structure: an interval or tuple (``(0, 1]``, ``(1, -2)``) equals one with the same brackets
   and equal items in order; a set (``\\{1, 2\\}``) or a bare list (``1, 2``, as in "the
   solutions are 1, 2") equals one with equal items in any order; unions (``\\cup``) compare part
   by part, in order. Anything else is a scalar, compared as follows;
3. as numbers: when both read as numbers (:func:`plasmid_math.numeric.numeric_value`), exactly
   (``0.5`` equals ``1/2``, ``1000001`` is not ``1000000``), or within the relative ``tolerance``
   where one was written as a float (``1e-3``; see :mod:`plasmid_math.numeric`);
4. symbolically: both converted to plain expressions (:mod:`plasmid_math.latex`) and compared by
   sympy in a worker process under a time limit (:mod:`plasmid_math.symbolic`);
   ``\\frac{\\sqrt{2}}{2}`` equals ``\\frac{1}{\\sqrt{2}}``, ``2x+2`` equals ``2(x+1)``.

Bounded (:mod:`plasmid_math.bounds`): an answer longer than ``MAX_ANSWER_CHARS`` is not read, and
one beyond a bound (digits, exponent, nesting, power size) is not equal; no answer raises.

Percentages: ``p%`` equals both ``p`` and ``p/100`` (answer keys write "what percent" answers
without the sign, and a probability of ``0.1`` is ``10%``). So ``10%`` equals ``10`` and ``0.1``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from plasmid_math.bounds import OutOfBounds, answer_too_long
from plasmid_math.latex import latex_to_plain
from plasmid_math.normalize import normalize, split_items
from plasmid_math.numeric import numbers_equal, numeric_value, written_as_float

#: ``symbolic(a, b)`` for plain expressions: True when sympy shows them equal.
Symbolic = Callable[[str, str], bool]


@dataclass(frozen=True)
class Shape:
    """A normalised answer's structure: ``kind`` is scalar, interval, set, list or union."""

    kind: str
    items: tuple = ()
    brackets: str = ""
    text: str = ""


def _matching_close(text: str, start: int) -> int:
    """Index of the bracket closing the one at ``start`` (any of ``( [``, closed by ``) ]``)."""
    depth = 0
    for index in range(start, len(text)):
        if text[index] in "([{":
            depth += 1
        elif text[index] in ")]}":
            depth -= 1
            if depth == 0:
                return index
    return -1


def shape(text: str) -> Shape:
    """The structure of normalised answer ``text`` (see the module docstring)."""
    if "\\cup" in text:
        parts = text.split("\\cup")
        if all(parts):
            return Shape("union", tuple(shape(part) for part in parts))
    if text.startswith("\\{") and text.endswith("\\}"):
        return Shape("set", tuple(item for item in split_items(text[2:-2]) if item))
    if len(text) >= 2 and text[0] in "([" and text[-1] in ")]" and _matching_close(text, 0) == len(text) - 1:
        items = split_items(text[1:-1])
        if len(items) >= 2:
            return Shape("interval", tuple(items), text[0] + text[-1])
    items = split_items(text)
    if len(items) >= 2 and all(items):
        return Shape("list", tuple(items))
    return Shape("scalar", text=text)


def equivalent(answer: str, reference: str, symbolic: Symbolic | None, tolerance: float = 1e-6) -> bool:
    """Whether ``answer`` equals ``reference`` (raw strings; see the module docstring). ``answer``
    may be hostile: it is bounded before it is read (:mod:`plasmid_math.bounds`)."""
    if answer_too_long(answer, reference):
        return False
    left, right = normalize(answer), normalize(reference)
    if not left or not right:
        return False
    if left == right:
        return True
    try:
        return _same_shape(shape(left), shape(right), symbolic, tolerance)
    except OutOfBounds:
        return False


def _same_shape(left: Shape, right: Shape, symbolic: Symbolic | None, tolerance: float) -> bool:
    unordered = ("set", "list")
    if left.kind in unordered and right.kind in unordered:
        return _same_multiset(list(left.items), list(right.items), symbolic, tolerance)
    if left.kind != right.kind:
        return False
    if left.kind == "scalar":
        return scalars_equal(left.text, right.text, symbolic, tolerance)
    if left.kind == "interval":
        return (left.brackets == right.brackets and len(left.items) == len(right.items)
                and all(scalars_equal(a, b, symbolic, tolerance) for a, b in zip(left.items, right.items, strict=True)))
    return len(left.items) == len(right.items) and all(
        _same_shape(a, b, symbolic, tolerance) for a, b in zip(left.items, right.items, strict=True))


def _same_multiset(left: list[str], right: list[str], symbolic: Symbolic | None, tolerance: float) -> bool:
    if len(left) != len(right):
        return False
    remaining = list(right)
    for item in left:
        for position, candidate in enumerate(remaining):
            if _same_shape(shape(item), shape(candidate), symbolic, tolerance):
                del remaining[position]
                break
        else:
            return False
    return True


def _readings(text: str) -> list[tuple[str, bool]]:
    """``(text, divided_by_100)`` readings of a scalar: ``p%`` reads as ``p`` and as ``p/100``."""
    if text.endswith("%") and len(text) > 1:
        return [(text[:-1], False), (text[:-1], True)]
    return [(text, False)]


def scalars_equal(left: str, right: str, symbolic: Symbolic | None, tolerance: float = 1e-6) -> bool:
    """Steps 3 and 4 of the module docstring for two normalised scalars."""
    for left_text, left_percent in _readings(left):
        for right_text, right_percent in _readings(right):
            if _one_reading_equal(left_text, left_percent, right_text, right_percent, symbolic, tolerance):
                return True
    return False


def _one_reading_equal(left: str, left_percent: bool, right: str, right_percent: bool,
                       symbolic: Symbolic | None, tolerance: float) -> bool:
    if left == right and left_percent == right_percent:
        return True
    left_value, right_value = numeric_value(left), numeric_value(right)
    if left_value is not None and right_value is not None:
        return numbers_equal(left_value / (100 if left_percent else 1), right_value / (100 if right_percent else 1),
                             tolerance, written_as_float(left) or written_as_float(right))
    if symbolic is None:
        return False
    left_plain, right_plain = latex_to_plain(left), latex_to_plain(right)
    if left_plain is None or right_plain is None:
        return False
    if left_percent:
        left_plain = f"({left_plain})/100"
    if right_percent:
        right_plain = f"({right_plain})/100"
    return symbolic(left_plain, right_plain)
