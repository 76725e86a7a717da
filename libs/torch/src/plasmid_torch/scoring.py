"""Scoring the same token sequences through an engine and a trainer: what ``plasmid parity`` and the
weight-sync probe (:meth:`plasmid_torch.sync_guard.SyncGuard.verify`) share.

- :func:`model_vocab`: the vocabulary size a model directory declares.
- :func:`probe_sequences`: a fixed set of short token sequences drawn from a vocabulary with a seed.
- :func:`engine_scores` / :func:`trainer_scores`: the log-probs of each sequence's response tokens
  under an engine's ``response_logprobs`` and a trainer's ``logprobs``.
- :func:`max_difference`: the largest ``|engine - trainer|`` and where it is.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from plasmid.types import Sample

#: The probe: this many sequences ...
PROBE_SEQUENCES = 4
#: ... of this many tokens each ...
PROBE_LENGTH = 16
#: ... the first this many of them the prompt, the rest the scored response.
PROBE_PROMPT = 4


def model_vocab(model_dir: str | Path | None) -> int | None:
    """``vocab_size`` of ``model_dir``'s ``config.json`` (its ``text_config``'s for a vision-language
    model), or ``None`` when there is no such file or it names none."""
    if not model_dir:
        return None
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    return int(size) if size else None


def probe_sequences(vocab_size: int, seed: int) -> list[tuple[list[int], int]]:
    """:data:`PROBE_SEQUENCES` sequences of :data:`PROBE_LENGTH` token ids drawn uniformly from
    ``[0, vocab_size)`` by a generator seeded with ``seed``, each as ``(token_ids, prompt_length)``
    with :data:`PROBE_PROMPT` prompt tokens. The same arguments give the same sequences."""
    if vocab_size < 1:
        raise ValueError(f"probe_sequences: vocab_size must be positive, got {vocab_size}")
    rng = random.Random(seed)
    return [([rng.randrange(vocab_size) for _ in range(PROBE_LENGTH)], PROBE_PROMPT) for _ in range(PROBE_SEQUENCES)]


async def engine_scores(engine: Any, sequences: Sequence[tuple[list[int], int]],
                        temperature: float) -> list[list[float]]:
    """``engine.response_logprobs`` of every ``(token_ids, prompt_length)``, concurrently (an engine
    batches them), in order."""
    results = await asyncio.gather(*(engine.response_logprobs(list(tokens), prompt_length, temperature)
                                     for tokens, prompt_length in sequences))
    return [list(scores) for scores in results]


async def trainer_scores(trainer: Any, sequences: Sequence[tuple[list[int], int]],
                         temperature: float) -> list[list[float]]:
    """``trainer.logprobs`` of every ``(token_ids, prompt_length)`` (as one call), in order."""
    samples = [Sample(tokens=list(tokens), response_length=len(tokens) - prompt_length, index=index)
               for index, (tokens, prompt_length) in enumerate(sequences)]
    return [list(scores) for scores in await trainer.logprobs(samples, temperature)]


def max_difference(engine: Sequence[Sequence[float]],
                   trainer: Sequence[Sequence[float]]) -> tuple[float, int, int]:
    """``(largest |engine - trainer|, sequence, response position)`` over every scored token; a
    non-finite value on either side counts as a difference of infinity. ``ValueError`` when the two
    sides scored different numbers of sequences or tokens."""
    if len(engine) != len(trainer):
        raise ValueError(f"the engine scored {len(engine)} sequences, the trainer {len(trainer)}")
    worst, where = 0.0, (0, 0)
    for index, (ours, theirs) in enumerate(zip(engine, trainer, strict=True)):
        if len(ours) != len(theirs):
            raise ValueError(f"sequence {index}: the engine scored {len(ours)} tokens, the trainer {len(theirs)}")
        for position, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            gap = abs(a - b) if math.isfinite(a) and math.isfinite(b) else math.inf
            if gap > worst or (gap == math.inf and worst != math.inf):
                worst, where = gap, (index, position)
    return worst, where[0], where[1]


__all__ = ["PROBE_LENGTH", "PROBE_PROMPT", "PROBE_SEQUENCES", "engine_scores", "max_difference", "model_vocab",
           "probe_sequences", "trainer_scores"]
