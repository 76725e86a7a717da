"""Tensor math that engines, trainers and losses must compute identically (imports torch).

Not imported by ``import plasmid``; plugins that use torch import it. Keeping one definition is
what makes the engine's log-probs and the trainer's agree to float rounding.
"""

from __future__ import annotations

import torch


def logprobs_from_logits(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-probability of ``tokens`` under ``softmax(logits / temperature)``.

    :param logits: ``[..., V]`` any float dtype; computed in float32.
    :param tokens: ``[...]`` int64 token ids (the tokens those logits predict).
    :param temperature: the sampling temperature; 0 (greedy) is treated as 1.
    :returns: ``[...]`` float32 natural-log probabilities.
    """
    scaled = _scaled(logits, temperature)
    picked = scaled.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(scaled, dim=-1)


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy (nats) of ``softmax(logits / temperature)`` over the last dim: ``[..., V] -> [...]``."""
    scaled = _scaled(logits, temperature)
    log_probs = torch.log_softmax(scaled, dim=-1)
    return -(log_probs.exp() * log_probs).sum(-1)


def _scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    logits = logits.float()
    if temperature and temperature != 1.0:
        logits = logits / temperature
    return logits


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` where ``mask`` is 1 (0 when nothing is masked in)."""
    total = (values * mask).sum() if dim is None else (values * mask).sum(dim)
    count = mask.sum() if dim is None else mask.sum(dim)
    return total / count.clamp(min=1)
