"""SQuAD-style answer normalisation, for comparing free-text answers.

``normalize_answer`` case-folds the text, removes punctuation (ASCII punctuation and symbols such
as ``$ + = ^``, and every Unicode punctuation character), removes the English articles
``a``/``an``/``the`` as whole words, and collapses runs of whitespace to one space.

It is meant for short free-text answers ("The Eiffel Tower." equals "eiffel tower"). It is not
for numbers: removing punctuation turns ``-3`` into ``3`` and ``3.5`` into ``35``; score those
with ``exact``.
"""

from __future__ import annotations

import re
import string
import unicodedata

_ARTICLES = re.compile(r"\b(?:a|an|the)\b")
_ASCII_PUNCTUATION = frozenset(string.punctuation)


def _is_punctuation(char: str) -> bool:
    return char in _ASCII_PUNCTUATION or unicodedata.category(char).startswith("P")


def normalize_answer(text: str) -> str:
    """``text`` case-folded, without punctuation or articles, single-spaced, stripped.

    The steps run in SQuAD's order: case, punctuation, articles, whitespace; so ``"The."``
    becomes ``""`` and ``"a-b"`` becomes ``"ab"``.
    """
    folded = text.casefold()
    without_punctuation = "".join(char for char in folded if not _is_punctuation(char))
    without_articles = _ARTICLES.sub(" ", without_punctuation)
    return " ".join(without_articles.split())


def answer_tokens(text: str) -> list[str]:
    """The words of ``normalize_answer(text)``, in order (what token F1 counts)."""
    return normalize_answer(text).split()
