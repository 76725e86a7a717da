"""Reading a normalised answer as a number, and comparing numbers with a tolerance."""

from __future__ import annotations

import math
import re
from fractions import Fraction

DECIMAL = r"-?(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?"
PLAIN = re.compile(DECIMAL)
SLASH = re.compile(rf"({DECIMAL})/({DECIMAL})")
FRAC = re.compile(rf"(-?)\\frac\{{({DECIMAL})\}}\{{({DECIMAL})\}}")
MIXED = re.compile(r"(-?)(\d+)\\frac\{(\d+)\}\{(\d+)\}")


def numeric_value(text: str) -> Fraction | None:
    """The exact value of a normalised answer that is a plain number: ``3``, ``-2.5``, ``1e-3``,
    ``3/4``, ``\\frac{3}{4}``, ``-\\frac{3}{4}``, or a mixed number ``2\\frac{1}{2}`` (= 5/2, as
    answer keys write it); None for anything else (and for a zero denominator)."""
    try:
        if PLAIN.fullmatch(text):
            return Fraction(text)
        if match := SLASH.fullmatch(text):
            return Fraction(match.group(1)) / Fraction(match.group(2))
        if match := FRAC.fullmatch(text):
            value = Fraction(match.group(2)) / Fraction(match.group(3))
            return -value if match.group(1) else value
        if match := MIXED.fullmatch(text):
            value = int(match.group(2)) + Fraction(int(match.group(3)), int(match.group(4)))
            return -value if match.group(1) else value
    except (ZeroDivisionError, ValueError):
        return None
    return None


def close(a: Fraction | float, b: Fraction | float, relative: float) -> bool:
    """Equal within ``relative`` tolerance (and 1e-12 absolute, for answers near zero)."""
    if a == b:
        return True
    return math.isclose(float(a), float(b), rel_tol=relative, abs_tol=1e-12)
