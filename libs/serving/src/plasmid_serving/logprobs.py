"""Log-probs of a served model, rescaled to another sampling temperature (exactly)."""

from __future__ import annotations

import math
from collections.abc import Mapping


def logprob_at_temperature(logprobs: Mapping[int, float], token: int, temperature: float) -> float:
    """``log softmax(logits / T)[token]`` from ``logprobs = log softmax(logits)`` over the whole
    vocabulary (``{token id: log-prob}``), in float64."""
    scaled = {t: lp / temperature for t, lp in logprobs.items()}
    top = max(scaled.values())
    return scaled[token] - (top + math.log(sum(math.exp(v - top) for v in scaled.values())))
