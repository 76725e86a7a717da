"""LaTeX answer text: unwrapping commands, canonical fractions, and conversion to a plain
expression for the symbolic check.

The plain syntax (what :mod:`plasmid_math.expression` parses) has numbers, one-letter symbols,
Greek letter names, ``pi``, ``e``, ``i``, ``oo``, the functions ``sqrt sin cos tan cot sec csc
asin acos atan ln log exp``, ``+ - * / ^``, parentheses and implicit multiplication.

The conversion recurses once per brace group, so text nested deeper than ``MAX_DEPTH``
(:mod:`plasmid_math.bounds`) is not converted.
"""

from __future__ import annotations

import re

from plasmid_math.bounds import MAX_DEPTH, nesting_depth
from plasmid_math.extract import braced

#: Commands whose braced argument is plain text or formatting: replaced by the argument.
TEXT_COMMANDS = ("text", "textbf", "textit", "textrm", "textnormal", "mathrm", "mathbf", "mathit", "mbox",
                 "operatorname", "boldsymbol", "displaystyle")
FUNCTIONS = {"sin": "sin", "cos": "cos", "tan": "tan", "cot": "cot", "sec": "sec", "csc": "csc",
             "arcsin": "asin", "arccos": "acos", "arctan": "atan", "ln": "ln", "log": "log", "exp": "exp"}
GREEK = frozenset("alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu xi "
                  "rho sigma tau upsilon phi varphi chi psi omega".split())
#: Commands that only space or size things: dropped.
SPACING = frozenset({"left", "right", "big", "Big", "bigg", "Bigg", "bigl", "bigr", "Bigl", "Bigr", "!", ",", ";",
                     ":", " ", "quad", "qquad", "displaystyle", "limits"})
PLAIN_CHARS = re.compile(r"[0-9a-zA-Z.+\-*/^() ]")


def unwrap_commands(text: str, names: tuple[str, ...] = TEXT_COMMANDS) -> str:
    """``\\text{abc}`` -> ``abc`` for each command in ``names`` (nested ones too)."""
    pattern = re.compile(r"\\(" + "|".join(names) + r")\s*(?=\{)")
    while True:
        match = pattern.search(text)
        if not match:
            return text
        group = braced(text, match.end())
        if group is None:
            return text[: match.start()] + text[match.end() :]
        content, after = group
        text = text[: match.start()] + content + text[after:]


def canonical_fractions(text: str) -> str:
    """``\\dfrac``/``\\tfrac`` -> ``\\frac``; ``\\frac12``, ``\\frac1{2}``, ``\\frac{1}2`` ->
    ``\\frac{1}{2}``; ``\\sqrt2`` -> ``\\sqrt{2}``."""
    text = re.sub(r"\\[dt]frac(?![a-zA-Z])", r"\\frac", text)
    text = re.sub(r"\\frac\s*([0-9a-zA-Z])\s*([0-9a-zA-Z])", r"\\frac{\1}{\2}", text)
    text = re.sub(r"\\frac\s*([0-9a-zA-Z])\s*\{", r"\\frac{\1}{", text)
    text = re.sub(r"\\frac\s*(\{[^{}]*\})\s*([0-9a-zA-Z])", r"\\frac\1{\2}", text)
    return re.sub(r"\\sqrt\s*([0-9a-zA-Z])", r"\\sqrt{\1}", text)


class Unsupported(ValueError):
    """The text uses LaTeX that the plain syntax has no equivalent for."""


def _argument(text: str, index: int) -> tuple[str, int]:
    """One macro argument starting at ``index``: a braced group, a command, or one character."""
    while index < len(text) and text[index] == " ":
        index += 1
    if index >= len(text):
        raise Unsupported("missing argument")
    if text[index] == "{":
        group = braced(text, index)
        if group is None:
            raise Unsupported("unbalanced braces")
        return group
    if text[index] == "\\":
        match = re.match(r"\\([a-zA-Z]+|.)", text[index:])
        assert match is not None
        return match.group(0), index + len(match.group(0))
    return text[index], index + 1


def to_plain(text: str) -> str:
    """``text`` (normalised LaTeX) in the plain syntax; raises :class:`Unsupported`."""
    out: list[str] = []
    index = 0
    while index < len(text):
        char = text[index]
        if char == "\\":
            match = re.match(r"\\([a-zA-Z]+|.)", text[index:])
            if match is None:
                raise Unsupported("a lone backslash")
            name = match.group(1)
            index += len(match.group(0))
            if name == "frac":
                numerator, index = _argument(text, index)
                denominator, index = _argument(text, index)
                out.append(f"(({to_plain(numerator)})/({to_plain(denominator)}))")
            elif name == "sqrt":
                degree = None
                if index < len(text) and text[index] == "[":
                    close = text.find("]", index)
                    if close < 0:
                        raise Unsupported("unclosed \\sqrt[")
                    degree, index = text[index + 1 : close], close + 1
                radicand, index = _argument(text, index)
                inner = to_plain(radicand)
                out.append(f"sqrt({inner})" if degree is None else f"(({inner})^(1/({to_plain(degree)})))")
            elif name in ("cdot", "times", "ast"):
                out.append("*")
            elif name == "div":
                out.append("/")
            elif name == "pi":
                out.append(" pi ")
            elif name == "infty":
                out.append(" oo ")
            elif name in FUNCTIONS:
                out.append(f" {FUNCTIONS[name]} ")
            elif name in GREEK:
                out.append(f" {name} ")
            elif name in SPACING:
                continue
            else:
                raise Unsupported(f"\\{name}")
        elif char == "{":
            group = braced(text, index)
            if group is None:
                raise Unsupported("unbalanced braces")
            out.append(f"({to_plain(group[0])})")
            index = group[1]
        elif char == "^":
            exponent, index = _argument(text, index + 1)
            out.append(f"^({to_plain(exponent)})")
        elif char in "[]":
            out.append("()"["[]".index(char)])
            index += 1
        elif PLAIN_CHARS.fullmatch(char):
            out.append(char)
            index += 1
        else:
            raise Unsupported(repr(char))
    return "".join(out)


def latex_to_plain(text: str) -> str | None:
    """:func:`to_plain`, or None when the text cannot be expressed in the plain syntax or nests
    brackets deeper than ``MAX_DEPTH``."""
    if nesting_depth(text) > MAX_DEPTH:
        return None
    try:
        plain = to_plain(text)
    except Unsupported:
        return None
    return plain if plain.strip() else None
