"""Choosing each row's next token from its logits, and the token's log-probability.

A row samples with its own :class:`~plasmid.types.SamplingParams`:

- ``temperature == 0``: greedy (``argmax`` of the logits).
- otherwise Gumbel-max over ``logits / temperature``, restricted by top-k and top-p: a token is
  kept when it is among the ``top_k`` most likely (``top_k <= 0``: all) and the probability mass
  of the tokens more likely than it is below ``top_p`` (so the most likely token is always kept).
  ``argmax(scaled + Gumbel noise)`` over the kept tokens is an exact draw from the renormalised
  kept distribution.

Randomness is per row: a row with a ``seed`` draws its noise from its own ``torch.Generator``
(seeded once when the request arrives), one ``[vocab]`` draw per sampled token, so its tokens
depend only on its seed and its logits, never on which other requests share the batch. Rows
without a seed share the engine's generator.

Everything runs on the logits' device, and every generator must live there too (the engine makes
them on its ``--device``): on a GPU a step's ``[rows, vocab]`` logits never leave it, only the
``[rows]`` tokens and log-probs do. (At a 151,936-token vocabulary and 256 rows, copying the
logits out and sampling them on this project's 2-core CPU took 323 ms per decoding step.) CPU and
CUDA generators are different streams, so a seed draws different noise on each device.

The reported log-probability is of the chosen token under ``softmax(logits / temperature)``
before top-k/top-p (temperature 1 for greedy rows), computed by
:func:`plasmid_torch.ops.logprobs_from_logits`, the function the trainer uses.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch

from plasmid.types import SamplingParams
from plasmid_torch.ops import logprobs_from_logits

#: ``top_k`` of a row without a top-k filter (larger than any vocabulary).
_NO_TOP_K = 2**62


class SamplingBatch:
    """The sampling settings of a batch's rows as tensors (one entry per row, in row order).

    Built once per batch composition (when rows join or leave), not per decoding step.

    :param params: each row's sampling parameters.
    :param generators: each row's own generator (rows with a ``seed``) or ``None``.
    """

    def __init__(self, params: Sequence[SamplingParams], generators: Sequence[torch.Generator | None]) -> None:
        temperatures = [p.temperature for p in params]
        sampled = [row for row, t in enumerate(temperatures) if t > 0]
        self.rows = len(params)
        self.all_greedy = not sampled
        self.any_greedy = len(sampled) < self.rows
        self.greedy = torch.tensor([t == 0 for t in temperatures], dtype=torch.bool)
        #: ``[rows, 1]`` the divisor of the logits: the temperature, or 1 for greedy rows.
        self.divisor = torch.tensor([[t if t > 0 else 1.0] for t in temperatures], dtype=torch.float32)
        self.unit_temperature = all(t in (0, 1) for t in temperatures)
        self.filtered = any(params[row].top_k > 0 or params[row].top_p < 1 for row in sampled)
        self.top_k = torch.tensor([[p.top_k if p.top_k > 0 else _NO_TOP_K] for p in params], dtype=torch.int64)
        self.top_p = torch.tensor([[p.top_p] for p in params], dtype=torch.float32)
        #: ``(row, generator)`` of the sampled rows that carry a seed.
        self.seeded = [(row, generators[row]) for row in sampled if generators[row] is not None]
        shared = [row for row in sampled if generators[row] is None]
        self.all_shared = len(shared) == self.rows
        self.shared_rows = torch.tensor(shared, dtype=torch.int64)
        self._on: dict[torch.device, SamplingBatch] = {}

    def on(self, device: torch.device) -> SamplingBatch:
        """These settings with their tensors on ``device`` (``self`` on the CPU; moved once per
        device, when a GPU batch first samples)."""
        if device.type == "cpu":
            return self
        if device not in self._on:
            moved = copy.copy(self)
            for name in ("greedy", "divisor", "top_k", "top_p", "shared_rows"):
                setattr(moved, name, getattr(self, name).to(device))
            moved._on = {}
            self._on[device] = moved
        return self._on[device]


def sample_tokens(logits: torch.Tensor, sampling: SamplingBatch,
                  shared_generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's next token and its log-probability.

    :param logits: ``[rows, vocab]`` the logits of each row's next position, on any device.
    :param sampling: the rows' settings (same row order).
    :param shared_generator: the noise source of sampled rows without a seed (on the logits' device,
        as the rows' own generators).
    :returns: ``(tokens [rows] int64, logprobs [rows] float32)``, on the logits' device.
    """
    sampling = sampling.on(logits.device)
    logits = logits.float()
    scaled = logits if sampling.unit_temperature else logits / sampling.divisor
    if sampling.all_greedy:
        tokens = logits.argmax(-1)
    else:
        candidates = scaled
        if sampling.filtered:
            candidates = scaled.masked_fill(~_kept_tokens(scaled, sampling), float("-inf"))
        tokens = (candidates + _gumbel_noise(logits.shape, logits.device, sampling, shared_generator)).argmax(-1)
        if sampling.any_greedy:
            tokens = torch.where(sampling.greedy, logits.argmax(-1), tokens)
    return tokens, logprobs_from_logits(scaled, tokens)


def _kept_tokens(scaled: torch.Tensor, sampling: SamplingBatch) -> torch.Tensor:
    """``[rows, vocab]`` bool: the tokens that survive each row's top-k and top-p."""
    ordered, order = scaled.sort(dim=-1, descending=True, stable=True)
    probs = ordered.softmax(-1)
    mass_before = probs.cumsum(-1) - probs
    rank = torch.arange(scaled.shape[-1], device=scaled.device).unsqueeze(0)
    kept_in_order = (rank < sampling.top_k) & (mass_before < sampling.top_p)
    return torch.zeros_like(kept_in_order).scatter(-1, order, kept_in_order)


def _gumbel_noise(shape: torch.Size, device: torch.device, sampling: SamplingBatch,
                  shared_generator: torch.Generator) -> torch.Tensor:
    """``[rows, vocab]`` standard Gumbel noise on ``device``; zero on greedy rows (they ignore it)."""
    rows, vocab = shape
    if sampling.all_shared:
        uniform = torch.rand((rows, vocab), generator=shared_generator, device=device)
    else:
        # Greedy rows take the argmax of their logits; their (constant) noise is never used.
        uniform = torch.full((rows, vocab), 0.5, device=device)
        if len(sampling.shared_rows):
            uniform[sampling.shared_rows] = torch.rand((len(sampling.shared_rows), vocab), generator=shared_generator,
                                                       device=device)
        for row, generator in sampling.seeded:  # in place: the draw torch.rand(vocab, generator) makes
            uniform[row].uniform_(generator=generator)
    return uniform.log_().neg_().log_().neg_()
