"""The bounds on what the grader reads, checked before a parse starts.

The policy is an optimiser aimed at the grader: an answer that stalls or crashes it is found
and reinforced. So every parse is bounded before it starts, and an answer out of bounds is
"not equal" (score 0), never an exception and never a stall. An answer that equals the
reference as normalised text is still equal; that comparison comes first and is cheap. The
bounds hold for both sides, so a label beyond them (``1e2000``) is matched only as text.

- :data:`MAX_ANSWER_CHARS`: an answer is read only when it has at most 500 characters (or as
  many as the reference, if that is longer: labels are trusted data). The cap holds for the
  extracted final answer, not the response; extraction itself is linear-time on any response.
- :data:`MAX_DIGITS`: a number is read exactly only with at most 1,000 digits.
- :data:`MAX_EXPONENT`: a number in exponent form (``1e300``) only with ``|exponent| <= 1000``
  (``1e50000000`` would be a 50-million-digit integer).
- :data:`MAX_DEPTH`: brackets (``( [ {``) nest at most 20 deep in an answer that is converted
  for sympy (the converters recurse).
- :data:`MAX_POWER_BITS`: a power ``b^e`` with a numeric exponent (``\\exp`` too) is built by
  sympy only when ``|e|`` times the bits of the largest number in ``b`` (at least 1) is at most
  32,768, about 10,000 digits: ``2^{2023}`` and ``10^{1000}`` are built, ``9^{9^{9}}`` (370
  million digits) and ``e^{e^{e^{100}}}`` are refused before sympy starts computing them.

Within the bounds sympy can still be slow; ``--math-symbolic-timeout`` limits that
(:mod:`plasmid_math.symbolic`).
"""

from __future__ import annotations

MAX_ANSWER_CHARS = 500
MAX_DIGITS = 1000
MAX_EXPONENT = 1000
MAX_DEPTH = 20
MAX_POWER_BITS = 32_768

OPENING = "([{"
CLOSING = ")]}"


class OutOfBounds(ValueError):
    """An answer exceeds one of this module's bounds; it is graded "not equal"."""


def answer_too_long(answer: str, reference: str) -> bool:
    """Whether ``answer`` exceeds :data:`MAX_ANSWER_CHARS` (or the reference's length)."""
    return len(answer) > max(MAX_ANSWER_CHARS, len(reference))


def nesting_depth(text: str, opening: str = OPENING, closing: str = CLOSING) -> int:
    """The deepest nesting of brackets in ``text`` (unbalanced ones count as they come)."""
    depth = deepest = 0
    for char in text:
        if char in opening:
            depth += 1
            deepest = max(deepest, depth)
        elif char in closing:
            depth -= 1
    return deepest
