"""Finding the final answer in a response.

In order of preference (the first kind found wins; within a kind, the last occurrence):

1. ``\\boxed{...}`` or ``\\fbox{...}`` (nested braces allowed; ``\\boxed 5`` too);
2. a sentence such as "The answer is ...", "Final answer: ...", "Answer: ...": the rest of
   that line, up to the end of its sentence;
3. the last number in the text (``-3``, ``2.5``, ``1,000``, ``3/4``).

Kinds 1 and 2 are *explicit* answers; a format reward asks for one.

Linear-time on any response (a policy can write 100 KB of spaces or of ``1,000,000,...``): the
brace scan is one pass, and the regular expressions use possessive quantifiers where a
backtracking one would retry every split of a long run (``answer`` followed by 100,000 spaces
took more than 40 s), and a thousands-separated number never starts right after a three-digit
group (each group of ``1,000,000,...,0000`` started a scan of the rest: quadratic).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

BOX_COMMANDS = ("\\boxed", "\\fbox")
ANSWER_SENTENCE = re.compile(
    r"\b(?:final\s++answer|answer)\b\s*+(?:\*\*)?+\s*+(?:is|was|would\s++be|will\s++be|should\s++be|=|:)"
    r"\s*+(?:\*\*)?+\s*+:?+\s*+(.*)",
    re.IGNORECASE)
#: ``1,000,000`` (ending before a comma that is not followed by a digit: "1,000, so"; never
#: starting right after a three-digit group, so a long run is scanned at most twice), or ``-3``,
#: ``2.5``, ``3/4``, ``.5``.
NUMBER = re.compile(r"(?<!\d\d\d,)-?\d{1,3}(?:,\d{3})++(?:\.\d+)?+(?!\d|,\d)"
                    r"|-?\d+(?:\.\d+)?(?:/\d+)?|-?\.\d+")
#: A sentence ends at a period, exclamation or question mark followed by a space or the end.
SENTENCE_END = re.compile(r"[.!?](?:\s|$)")


@dataclass(frozen=True)
class FinalAnswer:
    """The answer text and how it was found: ``boxed``, ``sentence`` or ``last-number``."""

    text: str
    how: str

    @property
    def explicit(self) -> bool:
        return self.how in ("boxed", "sentence")


def braced(text: str, start: int) -> tuple[str, int] | None:
    """The content of the brace group opening at ``text[start] == "{"`` and the index after its
    closing brace; ``None`` when the braces are unbalanced."""
    depth = 0
    index = start
    while index < len(text):
        char = text[index]
        if char == "\\":  # an escaped character (\{ is a literal brace)
            index += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : index], index + 1
        index += 1
    return None


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (or ``\\boxed X``), or None."""
    found = None
    for command in BOX_COMMANDS:
        position = text.rfind(command)
        if position >= 0 and (found is None or position > found[0]):
            found = (position, command)
    if found is None:
        return None
    position, command = found
    rest = position + len(command)
    while rest < len(text) and text[rest] == " ":
        rest += 1
    if rest < len(text) and text[rest] == "{":
        group = braced(text, rest)
        if group is None:
            return None
        return group[0]
    match = re.match(r"[^\s$]+", text[rest:])
    if not match or rest == position + len(command):  # "\boxedx" is not "\boxed x"
        return None
    return match.group(0)


def answer_sentence(text: str) -> str | None:
    """What follows the last "the answer is" / "final answer:" on its line, to the sentence's end."""
    matches = list(ANSWER_SENTENCE.finditer(text))
    if not matches:
        return None
    rest = matches[-1].group(1).split("\n")[0]
    end = SENTENCE_END.search(rest)
    if end:
        rest = rest[: end.start()]
    rest = rest.strip().strip("*").strip()
    return rest or None


def last_number(text: str) -> str | None:
    matches = NUMBER.findall(text)
    return matches[-1] if matches else None


def final_answer(text: str, think_tag: str | None = None) -> FinalAnswer | None:
    """The final answer of ``text`` (see the module docstring), or None when there is none.

    With ``think_tag`` (e.g. ``"</think>"``), only what follows its last occurrence is read;
    a response without the tag has no answer.
    """
    if think_tag:
        position = text.rfind(think_tag)
        if position < 0:
            return None
        text = text[position + len(think_tag) :]
    text = text.replace("\u2212", "-")  # the Unicode minus sign (U+2212) reads as "-"
    boxed = last_boxed(text)
    if boxed is not None:
        return FinalAnswer(boxed.strip(), "boxed") if boxed.strip() else None
    sentence = answer_sentence(text)
    if sentence is not None:
        return FinalAnswer(sentence, "sentence")
    number = last_number(text)
    return FinalAnswer(number, "last-number") if number is not None else None
