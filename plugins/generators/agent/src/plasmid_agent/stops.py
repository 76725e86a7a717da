"""Stop strings, cut by the gateway on the engine's exact tokens.

A request's ``stop`` strings go to the engine as :attr:`plasmid.types.SamplingParams.stop`: torchgen,
SGLang and vLLM end the response at the token that completed one and return the tokens through it.
An engine that does not know the field generates as it would without it; for it, the gateway cuts
the output at the first stop string itself (on an engine that stopped there, the cut keeps every
token). What the client sees is the text before the stop string (OpenAI leaves the stop text out);
what is recorded for training are the engine's own tokens up to and including the token that
completed the stop string, with their log-probs, never re-tokenised. Sampling is left to right, so
those kept tokens are exactly what an engine that stopped on the string would have produced; the
tokens after the cut are dropped (only a fallback engine's work on them is wasted).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Cut:
    """Where a completion ends at a stop string.

    :ivar kept: how many of the engine's tokens are kept (through the token that completed the stop).
    :ivar text: the completion's text before the stop string (what the client is shown).
    :ivar stop: the stop string found.
    """

    kept: int
    text: str
    stop: str


def cut_at_stop(decode: Callable[[list[int]], str], token_ids: Sequence[int], stops: Sequence[str]) -> Cut | None:
    """The cut of ``token_ids`` at the earliest of ``stops`` in their text (``decode``: the ids as
    the client's text, special tokens skipped), or None when no stop string occurs.

    The kept count is the least ``k`` whose text ``decode(token_ids[:k])`` holds the stop string at
    the place it has in the whole text, found by bisection (a prefix's text is a prefix of the
    whole text, save an unfinished character at its end)."""
    if not stops or not token_ids:
        return None
    ids = list(token_ids)
    whole = decode(ids)
    found = [(whole.find(stop), len(stop), stop) for stop in stops if stop in whole]
    if not found:
        return None
    at, _, stop = min(found)

    def holds(count: int) -> bool:
        return decode(ids[:count])[at:at + len(stop)] == stop

    low, high = 1, len(ids)
    while low < high:
        middle = (low + high) // 2
        if holds(middle):
            high = middle
        else:
            low = middle + 1
    return Cut(kept=low, text=decode(ids[:low])[:at], stop=stop)
