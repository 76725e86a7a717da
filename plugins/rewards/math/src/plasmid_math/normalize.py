"""Normalising an answer string, so that equal answers written differently compare equal as text.

:func:`normalize` applies, in order: math delimiters (``$``, ``\\(``, ``\\[``) removed; Unicode
symbols to LaTeX (``−`` ``×`` ``π`` ``∞`` ``°``); text commands unwrapped (``\\text{cm}`` ->
``cm``, also ``\\mathrm``, ``\\mbox``, ``\\textbf``...); spacing and sizing commands dropped
(``\\left``, ``\\right``, ``\\!``, ``\\,``, ``\\quad``, ``~``); degrees dropped (``^\\circ``,
``^{\\circ}``, ``\\degree``); dollar signs dropped; ``\\%`` and the word "percent" become ``%``;
``\\dfrac``/``\\tfrac`` become ``\\frac``, with braces made explicit (``\\frac12`` ->
``\\frac{1}{2}``); a trailing full stop dropped; a trailing unit dropped (``5 cm``, ``12
\\text{ square units}``, ``3 hours``; a one-letter unit, ``5 m``, only after a bare number); a leading ``x =``
(one variable; also ``x \\in``) dropped, in each item of a list; a number spelt in words becomes digits
(``five`` -> ``5``); thousands separators removed (``1,000`` and ``1{,}000``, never ``1,2``);
whitespace removed; decimals without trailing zeros (``2.50`` -> ``2.5``, ``5.00`` -> ``5``) and
with a leading zero (``.5`` -> ``0.5``); ``infinity`` -> ``\\infty``; a purely alphabetic answer
lower-cased.
"""

from __future__ import annotations

import re

from plasmid_math.latex import canonical_fractions, unwrap_commands
from plasmid_math.words import words_to_int

UNICODE = {"−": "-", "–": "-", "—": "-", "×": "\\times ", "÷": "\\div ", "π": "\\pi ", "∞": "\\infty ",
           "√": "\\sqrt", "°": "", "·": "\\cdot ", "≤": "\\le ", "≥": "\\ge "}
SPACING = re.compile(r"\\(?:left|right|big|Big|bigg|Bigg|bigl|bigr|Bigl|Bigr|displaystyle|quad|qquad)(?![a-zA-Z])"
                     r"|\\[!,;: ]|~")
DEGREES = re.compile(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|\\degree|\^\s*\{\s*\}")
UNIT_WORDS = (
    "units?", "square units?", "sq units?", "cubic units?", "cm", "mm", "km", "meters?", "metres?", "centimeters?",
    "millimeters?", "kilometers?", "inches", "inch", "feet", "foot", "ft", "yards?", "yd", "miles?", "kg", "grams?",
    "kilograms?", "lbs?", "pounds?", "ounces?", "oz", "liters?", "litres?", "ml", "seconds?", "secs?", "minutes?",
    "mins?", "hours?", "hrs?", "days?", "weeks?", "months?", "years?", "degrees?", "dollars?", "cents?", "mph",
    "km/h", "m/s", "points?", "students?", "people", "persons?", "ways", "times", "apples", "marbles", "coins",
)
#: A unit word at the end, right after a digit or brace, or after a space.
POWER = r"(?:\s*\^\s*\{?\s*[23]\s*\}?|[²³])?"
TRAILING_UNIT = re.compile(
    r"(?:(?<=[\d}\)])\s*|\s+)(?:" + "|".join(UNIT_WORDS) + r")" + POWER + r"\s*$", re.IGNORECASE)
#: A one-letter unit (metres, seconds, grams, hours, litres), only after a bare number.
LETTER_UNIT = re.compile(r"^(-?[\d.,]+)\s+[msghlL]" + POWER + r"$")
LEADING_VARIABLE = re.compile(r"^\s*(?:[a-zA-Z]|\\[a-zA-Z]+)\s*(?:_\{?\w+\}?)?\s*(?:=(?!=)|\\in(?![a-zA-Z]))\s*")
THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
TEXT_ANSWER = re.compile(r"[a-z ]+", re.IGNORECASE)


def strip_delimiters(text: str) -> str:
    text = text.strip()
    for opening, closing in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if text.startswith(opening) and text.endswith(closing) and len(text) >= len(opening) + len(closing):
            return text[len(opening) : len(text) - len(closing)].strip()
    return text


def split_items(text: str) -> list[str]:
    """``text`` split at commas outside brackets and braces."""
    items, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            items.append(text[start:index])
            start = index + 1
    items.append(text[start:])
    return items


def _drop_leading_variables(text: str) -> str:
    """``x = 3`` -> ``3``; ``x = 1, y = 2`` -> ``1, 2``; but ``x + y = 3`` stays (an equation)."""
    if THOUSANDS.fullmatch(text.strip()):
        return text
    items = split_items(text)
    return ",".join(LEADING_VARIABLE.sub("", item, count=1) for item in items)


def _tidy_number(match: re.Match) -> str:
    number = match.group(0)
    if "." in number:
        number = number.rstrip("0").rstrip(".")
    if number.startswith("."):
        number = "0" + number
    return number or "0"


def normalize(answer: str) -> str:
    """``answer`` in the canonical form described in the module docstring."""
    text = strip_delimiters(answer)
    for symbol, latex in UNICODE.items():
        text = text.replace(symbol, latex)
    text = unwrap_commands(text)
    text = SPACING.sub(" ", text)
    text = DEGREES.sub("", text)
    text = text.replace("\\$", "").replace("$", "")
    text = re.sub(r"\\%|\s*percent\b", "%", text, flags=re.IGNORECASE)
    text = canonical_fractions(text)
    text = text.strip().rstrip(".").strip()
    text = LETTER_UNIT.sub(r"\1", TRAILING_UNIT.sub("", text).strip())
    text = _drop_leading_variables(text).strip()
    spelled = words_to_int(text)
    if spelled is not None:
        text = str(spelled)
    text = re.sub(r"(?<=\d)\{,\}(?=\d{3})", "", text)
    if THOUSANDS.fullmatch(text):
        text = text.replace(",", "")
    text = re.sub(r"\s+", "", text)
    text = re.sub(r"(?<![\d.])\d*\.\d+(?![\d.])", _tidy_number, text)
    text = re.sub(r"\\infinity|(?<![a-z\\])(?:infinity|inf)(?![a-z])", r"\\infty", text)
    if TEXT_ANSWER.fullmatch(text):
        text = text.lower()
    return text
