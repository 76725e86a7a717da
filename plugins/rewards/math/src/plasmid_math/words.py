"""English number words as integers: "five", "twenty-one", "one hundred and five", "3 thousand"."""

from __future__ import annotations

import re

from plasmid_math.bounds import MAX_DIGITS

UNITS = {word: value for value, word in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen".split())}
TENS = {word: 10 * value
        for value, word in enumerate("_ _ twenty thirty forty fifty sixty seventy eighty ninety".split())
        if word != "_"}
SCALES = {"hundred": 100, "thousand": 1000, "million": 10**6, "billion": 10**9}


def words_to_int(text: str) -> int | None:
    """The integer that ``text`` spells (case-insensitive, hyphens and "and" allowed), or None
    when it is not made only of number words. A leading "negative"/"minus" makes it negative.
    Digits among the words are ASCII digits, at most ``MAX_DIGITS`` of them (``5²`` is no number)."""
    tokens = [token for token in re.split(r"[\s-]+", text.strip().lower()) if token and token != "and"]
    sign = 1
    if tokens and tokens[0] in ("negative", "minus"):
        sign, tokens = -1, tokens[1:]
    if not tokens:
        return None
    total = current = 0
    for token in tokens:
        if token in UNITS:
            current += UNITS[token]
        elif token in TENS:
            current += TENS[token]
        elif token.isascii() and token.isdigit() and len(token) <= MAX_DIGITS:
            current += int(token)
        elif token == "hundred":
            current = max(current, 1) * 100
        elif token in SCALES:
            total += max(current, 1) * SCALES[token]
            current = 0
        else:
            return None
    if all(token.isascii() and token.isdigit() for token in tokens):
        return None  # plain digits are not words
    return sign * (total + current)
