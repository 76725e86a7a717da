"""Finding the program in a response, in time linear in its length.

A fenced block is three backticks, an optional language tag (``[A-Za-z0-9_+-]*`` after spaces or
tabs) and the rest of that line, a newline, then the body up to the next three backticks; the
closing fence may be missing at the very end of a response that was cut off. The scan below uses
``str.find`` only (no backtracking regular expression: a response of one fence and 100 KB without
a newline once cost seconds of host time).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

FENCE_MARK = "```"
PYTHON_TAGS = frozenset({"python", "python3", "py"})
_TAG = re.compile(r"[ \t]*([A-Za-z0-9_+-]*)")


def fenced_blocks(response: str) -> Iterator[tuple[str, str]]:
    """``(tag, body)`` of each fenced block of ``response``, in order (the tag as written)."""
    position = 0
    while (start := response.find(FENCE_MARK, position)) >= 0:
        newline = response.find("\n", start + 3)
        if newline < 0:
            return  # no newline after this fence, so after no later one either: no more blocks
        match = _TAG.match(response, start + 3, newline)
        tag = match.group(1) if match else ""
        end = response.find(FENCE_MARK, newline + 1)
        if end < 0:
            yield tag, response[newline + 1:]
            return
        yield tag, response[newline + 1:end]
        position = end + 3


def has_fence(response: str) -> bool:
    """Whether ``response`` holds at least one fenced block."""
    return next(fenced_blocks(response), None) is not None


def extract_code(response: str) -> str:
    """The program in ``response``: the last fenced block tagged ``python``/``python3``/``py``;
    else the last untagged fenced block; else the whole response (a bare program).

    A fence left open at the end of the response (generation stopped) counts as closed there.
    """
    tagged = untagged = None
    for tag, body in fenced_blocks(response):
        lowered = tag.lower()
        if lowered in PYTHON_TAGS:
            tagged = body
        elif lowered == "":
            untagged = body
    if tagged is not None:
        return tagged
    if untagged is not None:
        return untagged
    return response
