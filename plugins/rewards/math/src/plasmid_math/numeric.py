"""Reading a normalised answer as a number, and comparing two numbers.

Exact where the answer is exact: integers, fractions (``3/4``, ``\\frac{3}{4}``, mixed numbers)
and decimals written without an exponent (``0.1``, ``2.50``) are rationals and compare exactly
(:class:`fractions.Fraction`): ``1000001`` is not ``1000000``, ``0.3333333333`` is not ``1/3``.
A number written in exponent form (``1e-13``, ``3.333333e-1``) is a float: it also equals a number
within the relative ``tolerance`` (``--math-tolerance``), and there is no absolute tolerance, so
``1e-13`` is not ``0``.

Bounded before a :class:`~fractions.Fraction` is built (:mod:`plasmid_math.bounds`): at most
``MAX_DIGITS`` digits and ``|exponent| <= MAX_EXPONENT``, else :class:`OutOfBounds`.
"""

from __future__ import annotations

import re
from fractions import Fraction

from plasmid_math.bounds import MAX_DIGITS, MAX_EXPONENT, OutOfBounds

DECIMAL = r"-?(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?"
PLAIN = re.compile(DECIMAL)
SLASH = re.compile(rf"({DECIMAL})/({DECIMAL})")
FRAC = re.compile(rf"(-?)\\frac\{{({DECIMAL})\}}\{{({DECIMAL})\}}")
MIXED = re.compile(r"(-?)(\d+)\\frac\{(\d+)\}\{(\d+)\}")


def exact_decimal(text: str) -> Fraction:
    """The value of one decimal (``DECIMAL``), after checking its digits and exponent."""
    mantissa, _, exponent = text.partition("e")
    if len(mantissa) > MAX_DIGITS + 2:  # a sign and a point
        raise OutOfBounds(f"a number with more than {MAX_DIGITS} digits")
    if exponent and (len(exponent) > 6 or abs(int(exponent)) > MAX_EXPONENT):
        raise OutOfBounds(f"an exponent beyond +-{MAX_EXPONENT}")
    return Fraction(text)


def numeric_value(text: str) -> Fraction | None:
    """The exact value of a normalised answer that is a plain number: ``3``, ``-2.5``, ``1e-3``,
    ``3/4``, ``\\frac{3}{4}``, ``-\\frac{3}{4}``, or a mixed number ``2\\frac{1}{2}`` (= 5/2, as
    answer keys write it); None for anything else (and for a zero denominator). Raises
    :class:`OutOfBounds` for a number beyond the bounds (see the module docstring)."""
    try:
        if PLAIN.fullmatch(text):
            return exact_decimal(text)
        if match := SLASH.fullmatch(text):
            return exact_decimal(match.group(1)) / exact_decimal(match.group(2))
        if match := FRAC.fullmatch(text):
            value = exact_decimal(match.group(2)) / exact_decimal(match.group(3))
            return -value if match.group(1) else value
        if match := MIXED.fullmatch(text):
            value = exact_decimal(match.group(2)) + exact_decimal(match.group(3)) / exact_decimal(match.group(4))
            return -value if match.group(1) else value
    except OutOfBounds:
        raise
    except (ZeroDivisionError, ValueError):
        return None
    return None


def written_as_float(text: str) -> bool:
    """Whether a number :func:`numeric_value` reads was written in exponent form (a float)."""
    return "e" in text


def numbers_equal(a: Fraction, b: Fraction, tolerance: float, inexact: bool) -> bool:
    """``a == b``; when ``inexact`` (a float was written), also ``|a - b| <= tolerance * max(|a|, |b|)``,
    computed exactly (no float overflow for ``1e400``)."""
    if a == b:
        return True
    return inexact and abs(a - b) <= Fraction(tolerance) * max(abs(a), abs(b))
