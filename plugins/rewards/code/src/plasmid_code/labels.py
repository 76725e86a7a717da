"""The label of a code sample: the tests a program must pass.

Format (a dict, or that dict as a JSON string), with one or both keys::

    {"tests":   [{"stdin": "1 2\n", "stdout": "3\n"}, ...],
     "asserts": ["assert add(1, 2) == 3", ...]}

- ``tests``: each runs the program as ``__main__`` with ``stdin`` as its standard input; it
  passes when the program exits with status 0 within the limits and its standard output equals
  ``stdout``, compared line by line with trailing whitespace and trailing blank lines ignored.
- ``asserts``: the program is run once as module ``solution`` (so an ``if __name__ ==
  "__main__"`` block does not run), then each snippet runs in its namespace, in order; a snippet
  passes when it raises nothing. Snippets share the namespace; when the run is stopped (time
  limit), the snippets not yet passed fail.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


class LabelError(ValueError):
    """The label is not in the format above."""


@dataclass(frozen=True)
class StdioCase:
    stdin: str
    stdout: str


@dataclass(frozen=True)
class Suite:
    """The tests of one sample; ``size`` is what the reward's fraction is out of."""

    stdio: list[StdioCase] = field(default_factory=list)
    asserts: list[str] = field(default_factory=list)

    @property
    def size(self) -> int:
        return len(self.stdio) + len(self.asserts)


def parse_label(label: Any, where: str) -> Suite:
    """``label`` as a :class:`Suite`; ``where`` names the sample in errors."""
    hint = 'expected {"tests": [{"stdin": ..., "stdout": ...}], "asserts": ["assert ..."]}'
    if isinstance(label, str):
        try:
            label = json.loads(label)
        except json.JSONDecodeError as exc:
            raise LabelError(f"{where}: the label is a string but not JSON ({exc}); {hint}") from None
    if not isinstance(label, dict):
        raise LabelError(f"{where}: the label is {type(label).__name__} {label!r:.80}; {hint}")
    unknown = set(label) - {"tests", "asserts"}
    if unknown:
        raise LabelError(f"{where}: unknown label keys {sorted(unknown)}; {hint}")
    stdio = []
    for position, test in enumerate(label.get("tests") or []):
        if not isinstance(test, dict) or not isinstance(test.get("stdout"), str) or not isinstance(
                test.get("stdin", ""), str):
            raise LabelError(f"{where}: tests[{position}] is {test!r:.80}; each test is "
                             f'{{"stdin": "...", "stdout": "..."}} with string values')
        stdio.append(StdioCase(test.get("stdin", ""), test["stdout"]))
    asserts = label.get("asserts") or []
    if not isinstance(asserts, list) or not all(isinstance(snippet, str) for snippet in asserts):
        raise LabelError(f"{where}: 'asserts' must be a list of strings of Python code; {hint}")
    suite = Suite(stdio, list(asserts))
    if suite.size == 0:
        raise LabelError(f"{where}: the label has no tests; {hint}")
    return suite


def same_output(actual: str, expected: str) -> bool:
    """Equal line by line, ignoring trailing whitespace on each line and trailing blank lines."""

    def lines(text: str) -> list[str]:
        stripped = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
        while stripped and not stripped[-1]:
            stripped.pop()
        return stripped

    return lines(actual) == lines(expected)
