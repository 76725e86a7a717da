"""Finding the program in a response."""

from __future__ import annotations

import re

#: A fenced block: its language tag (maybe empty) and its body; the closing fence may be missing
#: at the very end of a response that was cut off.
FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
PYTHON_TAGS = frozenset({"python", "python3", "py"})


def extract_code(response: str) -> str:
    """The program in ``response``: the last fenced block tagged ``python``/``python3``/``py``;
    else the last untagged fenced block; else the whole response (a bare program).

    A fence left open at the end of the response (generation stopped) counts as closed there.
    """
    blocks = [(tag.lower(), body) for tag, body in FENCE.findall(response)]
    for wanted in (lambda tag: tag in PYTHON_TAGS, lambda tag: tag == ""):
        chosen = [body for tag, body in blocks if wanted(tag)]
        if chosen:
            return chosen[-1]
    return response
