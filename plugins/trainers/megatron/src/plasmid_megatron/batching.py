"""Samples to micro-batches: data-parallel shards balanced by tokens, micro-batches by count or token budget.

Every rank sees the whole step's samples and computes the same plan (no communication):

1. :func:`shard_for_data_parallel` gives each data-parallel rank a share of the samples, longest
   first to the rank with the fewest tokens so far (balanced tokens, not just counts).
2. :func:`plan_micro_batches` splits a rank's share into micro-batches: ``--micro-batch-size``
   samples each, or, with ``--max-tokens-per-micro-batch``, as many as fit a budget of *padded*
   tokens (``samples x longest``), longest first (a sample longer than the budget goes alone).
3. :func:`make_micro_batch` pads one micro-batch into tensors.

Sequences are right-padded: each real token keeps the position it had when the engine generated
it, and with causal attention the padding after a sequence cannot change its logits. Response
tensors are ``[b, T]`` with ``T`` the whole step's longest response, so that per-token results
line up with the step's :class:`plasmid.types.LossBatch` rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from plasmid.types import Sample


@dataclass
class MicroBatch:
    """One forward pass's worth of samples.

    :ivar rows: ``[b]`` int64 the samples' positions in the step's sample list.
    :ivar input_ids: ``[b, s]`` int64 prompt + response ids, right-padded; ``s`` is a multiple of
        the ``pad_to`` it was made with.
    :ivar position_ids: ``[b, s]`` int64, ``0 .. s - 1``.
    :ivar predicting: ``[b, T]`` int64 the position whose logits predict response token ``t``.
    :ivar targets: ``[b, T]`` int64 response token ``t``'s id (0 beyond the response).
    :ivar in_response: ``[b, T]`` bool ``t < response_length``.
    :ivar counts: ``False`` for a stand-in micro-batch of a data-parallel rank without samples;
        its loss must be multiplied by zero (it only keeps collectives in step).
    """

    rows: torch.Tensor
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    predicting: torch.Tensor
    targets: torch.Tensor
    in_response: torch.Tensor
    counts: bool = True

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def length(self) -> int:
        return int(self.input_ids.shape[1])

    def to(self, device: torch.device) -> MicroBatch:
        return MicroBatch(self.rows, self.input_ids.to(device), self.position_ids.to(device),
                          self.predicting.to(device), self.targets.to(device), self.in_response.to(device),
                          self.counts)


def response_mask(samples: Sequence[Sample], width: int) -> torch.Tensor:
    """``[B, width]`` float32: each sample's ``loss_mask`` (ones when unset), 0 beyond its response."""
    mask = torch.zeros((len(samples), width), dtype=torch.float32)
    for row, sample in enumerate(samples):
        values = sample.loss_mask if sample.loss_mask is not None else [1] * sample.response_length
        mask[row, : sample.response_length] = torch.tensor(values, dtype=torch.float32)
    return mask


def per_token(values: Sequence[Sequence[float]], width: int) -> torch.Tensor:
    """Right-pad per-response-token lists with zeros into ``[B, width]`` float32."""
    out = torch.zeros((len(values), width), dtype=torch.float32)
    for row, row_values in enumerate(values):
        out[row, : len(row_values)] = torch.tensor(list(row_values), dtype=torch.float32)
    return out


def shard_for_data_parallel(lengths: Sequence[int], rows: Sequence[int], dp_size: int) -> list[list[int]]:
    """Split ``rows`` (positions into ``lengths``) over ``dp_size`` ranks with balanced token counts.

    Longest first, each to the rank with the fewest tokens so far (ties: the lowest rank); each
    rank's rows come back in their original order. Deterministic: every rank computes the same.
    """
    shares: list[list[int]] = [[] for _ in range(dp_size)]
    load = [0] * dp_size
    for row in sorted(rows, key=lambda r: (-lengths[r], r)):
        rank = min(range(dp_size), key=lambda k: (load[k], k))
        shares[rank].append(row)
        load[rank] += lengths[row]
    return [sorted(share) for share in shares]


def plan_micro_batches(lengths: Sequence[int], rows: Sequence[int], *, micro_batch_size: int,
                       max_tokens: int | None = None) -> list[list[int]]:
    """Split ``rows`` into micro-batches.

    Without ``max_tokens``: consecutive runs of ``micro_batch_size`` rows. With it: longest first,
    a micro-batch grows while ``rows x longest length <= max_tokens`` (and at most
    ``micro_batch_size`` rows); a row longer than the budget is a micro-batch of its own.
    """
    rows = list(rows)
    if not max_tokens:
        size = max(1, micro_batch_size)
        return [rows[start:start + size] for start in range(0, len(rows), size)]
    plans: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for row in sorted(rows, key=lambda r: (-lengths[r], r)):
        grown = max(longest, lengths[row])
        if current and ((len(current) + 1) * grown > max_tokens or len(current) >= micro_batch_size):
            plans.append(current)
            current, longest = [], 0
            grown = lengths[row]
        current.append(row)
        longest = grown
    if current:
        plans.append(current)
    return plans


def make_micro_batch(samples: Sequence[Sample], rows: Sequence[int], *, width: int, pad_id: int,
                     pad_to: int = 1, counts: bool = True) -> MicroBatch:
    """Tensors of the samples at ``rows``; ``width`` is the step's response width ``T`` and the
    sequence length is rounded up to a multiple of ``pad_to`` (tensor/context-parallel splits)."""
    picked = [samples[row] for row in rows]
    longest = max(len(sample.tokens) for sample in picked)
    length = -(-longest // pad_to) * pad_to
    input_ids = torch.full((len(picked), length), pad_id, dtype=torch.long)
    for row, sample in enumerate(picked):
        input_ids[row, : len(sample.tokens)] = torch.tensor(sample.tokens, dtype=torch.long)
    prompt_lengths = torch.tensor([s.prompt_length for s in picked], dtype=torch.long)
    response_lengths = torch.tensor([s.response_length for s in picked], dtype=torch.long)
    # the logit at position p predicts the token at p + 1: response token t sits at prompt + t
    predicting = (prompt_lengths.unsqueeze(1) - 1 + torch.arange(width)).clamp(max=length - 2)
    in_response = torch.arange(width).unsqueeze(0) < response_lengths.unsqueeze(1)
    targets = torch.where(in_response, input_ids.gather(1, predicting + 1), torch.zeros_like(predicting))
    position_ids = torch.arange(length).unsqueeze(0).expand(len(picked), -1).contiguous()
    return MicroBatch(torch.tensor(list(rows), dtype=torch.long), input_ids, position_ids, predicting, targets,
                      in_response, counts)
