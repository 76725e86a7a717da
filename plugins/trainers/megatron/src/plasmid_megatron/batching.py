"""Samples to micro-batches: data-parallel shards balanced by tokens, micro-batches by count or token budget.

Every rank sees the whole step's samples and computes the same plan (no communication):

1. :func:`shard_for_data_parallel` gives each data-parallel rank a share of the samples, longest
   first to the rank with the fewest tokens so far (balanced tokens, not just counts).
2. :func:`plan_micro_batches` splits a rank's share into micro-batches: ``--micro-batch-size``
   samples each, or, with ``--max-tokens-per-micro-batch``, as many as fit a budget of *padded*
   tokens (``samples x longest``), longest first (a sample longer than the budget goes alone).
3. :func:`make_micro_batch` pads one micro-batch into tensors and, with context parallelism, keeps
   this rank's part of every sequence.

Sequences are right-padded: each real token keeps the position it had when the engine generated
it, and with causal attention the padding after a sequence cannot change its logits. Response
tensors are ``[b, T]`` with ``T`` the whole step's longest response, so that per-token results
line up with the step's :class:`plasmid.types.LossBatch` rows.

Context parallelism (``cp > 1``): data-parallel sharding uses the pure data-parallel rank and size, so
the ``cp`` ranks of a data-parallel rank plan the same micro-batches. Each pads its sequences to a
multiple of ``2 * cp`` (times ``pad_to``), cuts them into ``2 * cp`` chunks and keeps chunks ``r`` and
``2 * cp - 1 - r`` (:func:`context_parallel_positions`), megatron's load-balanced layout. The logit
predicting a response token lives on one rank only; :func:`locate_positions` says which, and where in
its local sequence (see :mod:`plasmid_megatron.context_parallel` for how the results are combined).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from plasmid.types import Sample


@dataclass
class MicroBatch:
    """One forward pass's worth of samples.

    With context parallelism ``s`` is this rank's share ``S / cp`` of the padded length ``S``
    (``S == s`` without it).

    :ivar rows: ``[b]`` int64 the samples' positions in the step's sample list.
    :ivar input_ids: ``[b, s]`` int64 prompt + response ids, right-padded, this rank's chunks; ``S`` is
        a multiple of the ``pad_to`` it was made with (times ``2 * cp`` with ``cp > 1``).
    :ivar position_ids: ``[b, s]`` int64 the global positions of ``input_ids`` (``0 .. S - 1``
        without context parallelism).
    :ivar predicting: ``[b, T]`` int64 the local position (index into ``s``) whose logits predict
        response token ``t``; meaningful where ``held``, 0 elsewhere.
    :ivar targets: ``[b, T]`` int64 response token ``t``'s id (0 beyond the response).
    :ivar in_response: ``[b, T]`` bool ``t < response_length``.
    :ivar held: ``[b, T]`` bool this context-parallel rank holds the predicting position of ``t``
        (all ``True`` without context parallelism).
    :ivar sequence_length: ``S``, the padded length of the whole sequences.
    :ivar counts: ``False`` for a stand-in micro-batch of a data-parallel rank without samples;
        its loss must be multiplied by zero (it only keeps collectives in step).
    """

    rows: torch.Tensor
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    predicting: torch.Tensor
    targets: torch.Tensor
    in_response: torch.Tensor
    held: torch.Tensor
    sequence_length: int
    counts: bool = True

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def length(self) -> int:
        """The whole sequences' padded length ``S`` (megatron's ``seq_length``)."""
        return self.sequence_length

    def to(self, device: torch.device) -> MicroBatch:
        return MicroBatch(self.rows, self.input_ids.to(device), self.position_ids.to(device),
                          self.predicting.to(device), self.targets.to(device), self.in_response.to(device),
                          self.held.to(device), self.sequence_length, self.counts)


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


def context_parallel_positions(length: int, cp_size: int, cp_rank: int) -> torch.Tensor:
    """``[length // cp_size]`` int64: the global positions context-parallel rank ``cp_rank`` holds of
    a sequence of ``length`` (a multiple of ``2 * cp_size``), in its local order: chunk ``cp_rank``,
    then chunk ``2 * cp_size - 1 - cp_rank`` of the ``2 * cp_size`` equal chunks. ``0 .. length - 1``
    for ``cp_size == 1`` (any length)."""
    if cp_size == 1:
        return torch.arange(length)
    if length % (2 * cp_size):
        raise ValueError(f"a sequence of length {length} cannot be cut into 2 x {cp_size} equal chunks")
    if not 0 <= cp_rank < cp_size:
        raise ValueError(f"context-parallel rank {cp_rank} is not in 0 .. {cp_size - 1}")
    chunk = length // (2 * cp_size)
    last = 2 * cp_size - 1 - cp_rank
    return torch.cat([torch.arange(cp_rank * chunk, (cp_rank + 1) * chunk), torch.arange(last * chunk,
                                                                                         (last + 1) * chunk)])


def locate_positions(positions: torch.Tensor, length: int, cp_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Where global ``positions`` (int64, any shape, in ``0 .. length - 1``) of a sequence of ``length``
    live under :func:`context_parallel_positions`: ``(rank, local index)``, both shaped as
    ``positions``, so that ``context_parallel_positions(length, cp_size, rank)[local] == positions``."""
    if cp_size == 1:
        return torch.zeros_like(positions), positions.clone()
    if length % (2 * cp_size):
        raise ValueError(f"a sequence of length {length} cannot be cut into 2 x {cp_size} equal chunks")
    chunk = length // (2 * cp_size)
    index, within = positions // chunk, positions % chunk
    first = index < cp_size
    rank = torch.where(first, index, 2 * cp_size - 1 - index)
    local = torch.where(first, within, chunk + within)
    return rank, local


def make_micro_batch(samples: Sequence[Sample], rows: Sequence[int], *, width: int, pad_id: int,
                     pad_to: int = 1, cp_size: int = 1, cp_rank: int = 0, counts: bool = True) -> MicroBatch:
    """Tensors of the samples at ``rows`` as context-parallel rank ``cp_rank`` of ``cp_size`` holds them.

    ``width`` is the step's response width ``T``. The sequence length is rounded up to a multiple of
    ``pad_to`` (the tensor-parallel size with sequence parallelism, else 1), times ``2 * cp_size`` with
    ``cp_size > 1``; then each rank keeps its two chunks (see the module docstring)."""
    picked = [samples[row] for row in rows]
    longest = max(len(sample.tokens) for sample in picked)
    multiple = pad_to * (2 * cp_size if cp_size > 1 else 1)
    length = -(-longest // multiple) * multiple
    input_ids = torch.full((len(picked), length), pad_id, dtype=torch.long)
    for row, sample in enumerate(picked):
        input_ids[row, : len(sample.tokens)] = torch.tensor(sample.tokens, dtype=torch.long)
    prompt_lengths = torch.tensor([s.prompt_length for s in picked], dtype=torch.long)
    response_lengths = torch.tensor([s.response_length for s in picked], dtype=torch.long)
    # the logit at position p predicts the token at p + 1: response token t sits at prompt + t
    predicting = (prompt_lengths.unsqueeze(1) - 1 + torch.arange(width)).clamp(max=length - 2)
    in_response = torch.arange(width).unsqueeze(0) < response_lengths.unsqueeze(1)
    targets = torch.where(in_response, input_ids.gather(1, predicting + 1), torch.zeros_like(predicting))
    positions = context_parallel_positions(length, cp_size, cp_rank)
    owner, local = locate_positions(predicting, length, cp_size)
    held = owner == cp_rank
    return MicroBatch(rows=torch.tensor(list(rows), dtype=torch.long), input_ids=input_ids[:, positions].contiguous(),
                      position_ids=positions.unsqueeze(0).expand(len(picked), -1).contiguous(),
                      predicting=torch.where(held, local, torch.zeros_like(local)), targets=targets,
                      in_response=in_response, held=held, sequence_length=length, counts=counts)
