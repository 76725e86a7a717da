"""A small parser from the plain syntax (see :mod:`plasmid_math.latex`) to sympy expressions.

Hand-written on purpose: it builds sympy objects directly and never calls ``eval`` (sympy's own
``parse_expr`` does), so a response cannot run code through it. Grammar::

    expression := term (("+" | "-") term)*
    term       := unary (("*" | "/") unary | unary)*          (juxtaposition multiplies: 2x, 2(x+1))
    unary      := ("-" | "+") unary | power
    power      := atom ("^" unary)?                           (right-associative: 2^3^2 = 2^9)
    atom       := number | name | function ("^" atom)? power | "(" expression ")"

Names are one letter (``xy`` is ``x*y``) unless they are a known constant, function or Greek
letter. ``e`` is Euler's number, ``i`` the imaginary unit, ``oo`` infinity. A function applies
to the power that follows it (``sin x^2`` is ``sin(x^2)``); ``sin^2 x`` is ``(sin x)^2``.

Bounded, because sympy evaluates as it builds (:mod:`plasmid_math.bounds`): numbers have at most
``MAX_DIGITS`` digits, parentheses, exponents and function arguments nest at most ``MAX_NESTING``
(``3 * MAX_DEPTH``) deep (the parser recurses on each; ``x^x^x^...`` is a nesting too), and
a power with a numeric exponent (``exp`` too) is built only when ``|exponent|`` times the bits of
the largest number in its base (at least 1) is at most ``MAX_POWER_BITS``: ``9^(9^9)`` is refused
with a :class:`ParseError` before sympy starts computing 370 million digits.
"""

from __future__ import annotations

import re
from typing import Any

import sympy

from plasmid_math.bounds import MAX_DEPTH, MAX_DIGITS, MAX_POWER_BITS

TOKEN = re.compile(r"\s*(?:(\d+\.?\d*|\.\d+)|([a-zA-Z]+)|(.))")
FUNCTIONS = {
    "sqrt": sympy.sqrt, "sin": sympy.sin, "cos": sympy.cos, "tan": sympy.tan, "cot": sympy.cot, "sec": sympy.sec,
    "csc": sympy.csc, "asin": sympy.asin, "acos": sympy.acos, "atan": sympy.atan, "ln": sympy.log,
    "log": sympy.log, "exp": sympy.exp,
}
CONSTANTS = {"pi": sympy.pi, "oo": sympy.oo, "e": sympy.E, "i": sympy.I}
GREEK = ("alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu xi rho sigma "
         "tau upsilon phi varphi chi psi omega").split()
#: Longest first, so that "theta" is not read as "t", "h", "e"...
NAMES = sorted([*FUNCTIONS, *CONSTANTS, *GREEK], key=len, reverse=True)
#: How deep parentheses, exponents and function arguments may nest (the parser recurses on each).
MAX_NESTING = 3 * MAX_DEPTH


class ParseError(ValueError):
    """The text is not in the plain syntax."""


def tokenize(text: str) -> list[tuple[str, str]]:
    """``(kind, text)`` pairs; kinds are ``number``, ``name``, ``function`` and ``op``."""
    tokens: list[tuple[str, str]] = []
    position = 0
    text = text.rstrip()
    while position < len(text):
        match = TOKEN.match(text, position)
        if match is None:
            raise ParseError(f"cannot read {text[position:]!r}")
        position = match.end()
        number, word, op = match.groups()
        if number is not None:
            tokens.append(("number", number))
        elif word is not None:
            tokens.extend(_split_word(word))
        elif op in "+-*/^()":
            tokens.append(("op", op))
        else:
            raise ParseError(f"unexpected {op!r}")
    return tokens


def _split_word(word: str) -> list[tuple[str, str]]:
    pieces = []
    while word:
        for name in NAMES:
            if word.startswith(name):
                pieces.append(("function" if name in FUNCTIONS else "name", name))
                word = word[len(name) :]
                break
        else:
            pieces.append(("name", word[0]))
            word = word[1:]
    return pieces


def bounded_power(base: Any, exponent: Any) -> Any:
    """``base ** exponent``; raises :class:`ParseError` when the result could exceed
    ``MAX_POWER_BITS`` (see the module docstring): for a rational exponent, or a numeric one whose
    magnitude a 15-digit evaluation gives (``e^{e^{e^{100}}}``: sympy's own checks would try to
    evaluate it)."""
    if exponent.is_Rational:
        magnitude = abs(exponent)
    elif exponent.is_number:
        try:
            magnitude = abs(complex(exponent.evalf(15)))
        except (TypeError, ValueError, OverflowError):  # oo, zoo, nan: sympy knows what to do
            return base**exponent
    else:
        return base**exponent
    largest = max((max(abs(number.p), number.q).bit_length() for number in base.atoms(sympy.Rational)), default=0)
    if magnitude * max(largest, 1) > MAX_POWER_BITS:
        raise ParseError(f"a power beyond {MAX_POWER_BITS} bits")
    return base**exponent


class Parser:
    def __init__(self, text: str) -> None:
        self.tokens = tokenize(text)
        self.position = 0
        self.nesting = 0  # powers being parsed: parentheses, exponents and function arguments recurse here

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def take(self) -> tuple[str, str]:
        token = self.peek()
        if token is None:
            raise ParseError("unexpected end")
        self.position += 1
        return token

    def parse(self) -> Any:
        if not self.tokens:
            raise ParseError("empty")
        result = self.expression()
        if self.peek() is not None:
            raise ParseError(f"unexpected {self.peek()[1]!r}")
        return result

    def expression(self) -> Any:
        result = self.term()
        while (token := self.peek()) is not None and token in (("op", "+"), ("op", "-")):
            self.take()
            right = self.term()
            result = result + right if token[1] == "+" else result - right
        return result

    def term(self) -> Any:
        result = self.unary()
        while (token := self.peek()) is not None:
            if token in (("op", "*"), ("op", "/")):
                self.take()
                right = self.unary()
                result = result * right if token[1] == "*" else result / right
            elif token[0] in ("number", "name", "function") or token == ("op", "("):
                result = result * self.power()
            else:
                break
        return result

    def unary(self) -> Any:
        negative = False
        while (token := self.peek()) in (("op", "-"), ("op", "+")):  # a loop: "- - - ... x" cannot recurse
            self.take()
            negative ^= token[1] == "-"
        value = self.power()
        return -value if negative else value

    def power(self) -> Any:
        self.nesting += 1
        if self.nesting > MAX_NESTING:
            raise ParseError(f"nested deeper than {MAX_NESTING}")
        try:
            base = self.atom()
            if self.peek() == ("op", "^"):
                self.take()
                return bounded_power(base, self.unary())
            return base
        finally:
            self.nesting -= 1

    def atom(self) -> Any:
        kind, text = self.take()
        if kind == "number":
            if len(text) > MAX_DIGITS + 1:
                raise ParseError(f"a number with more than {MAX_DIGITS} digits")
            return sympy.Rational(text)
        if kind == "function":
            if self.peek() == ("op", "^"):  # sin^2 x = (sin x)^2
                self.take()
                exponent = self.atom()
                return bounded_power(self.function(text), exponent)
            return self.function(text)
        if kind == "name":
            return CONSTANTS[text] if text in CONSTANTS else sympy.Symbol(text)
        if text == "(":
            inner = self.expression()
            if self.take() != ("op", ")"):
                raise ParseError("missing )")
            return inner
        raise ParseError(f"unexpected {text!r}")

    def function(self, name: str) -> Any:
        """``name`` applied to the power that follows (``exp z`` bounded as ``e^z``)."""
        argument = self.power()
        return bounded_power(sympy.E, argument) if name == "exp" else FUNCTIONS[name](argument)


def parse(text: str) -> Any:
    """The sympy expression of ``text`` in the plain syntax; raises :class:`ParseError`."""
    return Parser(text).parse()
