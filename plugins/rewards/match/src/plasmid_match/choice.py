"""Multiple-choice answers: which option letter a response picks.

:func:`extract_choice` looks, in this order (the last occurrence within a rule wins):

1. an answer phrase: "Answer: (B)", "the answer is C", "the correct option is D", "choice: E",
   "option B";
2. ``\\boxed{C}``;
3. a bold letter: "**D**", "**(D)**", "**D.** Paris";
4. a letter in parentheses: "(B)";
5. a letter opening the response: "B", "B.", "B) Paris" (not "A cat ...");
6. the last standalone capital letter among the options ("... so B").

Letters are the option letters (``--choice-letters``, default ``ABCDE``). Capitals always count;
a lower-case letter counts only in rules 1 and 2 and only when no word follows it ("the answer is
c." but not "the answer is a prime").
"""

from __future__ import annotations

import re
from functools import lru_cache


@lru_cache(maxsize=16)
def _rules(letters: str) -> list[list[re.Pattern]]:
    """The rules of the module docstring, in order; each a list of patterns whose group is the letter."""
    upper = re.escape(letters.upper())
    lower = re.escape(letters.lower())
    letter = rf"(?:([{upper}])(?![A-Za-z])|([{lower}])(?=\s*(?:[).\]:*]|$)))"
    opening = r"[*(\[\s]*"
    return [
        [re.compile(rf"(?i:\b(?:answer|option|choice)\b)(?:\s+(?i:is|was|would\s+be|should\s+be)|\s*[:=])\s*"
                    rf"(?i:option\s+|choice\s+|letter\s+)?{opening}{letter}"),
         re.compile(rf"(?i:\b(?:option|choice)\b)\s+{opening}{letter}")],
        [re.compile(rf"\\boxed\{{\s*(?:\\text\{{)?\s*{letter}")],
        [re.compile(rf"\*\*\s*\(?([{upper}])(?![A-Za-z])")],
        [re.compile(rf"\(([{upper}])\)")],
        [re.compile(rf"^\s*\(?([{upper}])(?:[.):\]]|\s*$)")],
        [re.compile(rf"\b([{upper}])\b")],
    ]


def extract_choice(text: str, letters: str = "ABCDE") -> str | None:
    """The option letter ``text`` picks (upper case), or None (see the module docstring)."""
    for patterns in _rules(letters):
        matches = [match for pattern in patterns for match in pattern.finditer(text)]
        if matches:
            last = max(matches, key=lambda match: match.start())
            return next(group for group in last.groups() if group).upper()
    return None
