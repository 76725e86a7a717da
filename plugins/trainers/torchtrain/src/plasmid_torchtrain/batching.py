"""Samples to padded tensors, and a model's log-probs of the response tokens.

Sequences are right-padded, so every real token keeps the position it had when the engine
generated it (positions ``0 .. len - 1``) and the log-probs equal the engine's to float rounding.
Response tensors are ``[B, T]`` with ``T`` the longest response; position ``t`` of sample ``i``
is its ``t``-th response token.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from plasmid.types import Sample
from plasmid_torch import ops
from plasmid_torch.device import Placement
from plasmid_torch.training import check_samples, pad_rows, response_mask


@dataclass
class PaddedBatch:
    """Token ids and response masks of ``B`` samples.

    :ivar input_ids: ``[B, L]`` int64 prompt + response ids, right-padded with the pad id.
    :ivar attention_mask: ``[B, L]`` int64, 1 on real tokens.
    :ivar prompt_lengths: ``[B]`` int64.
    :ivar response_lengths: ``[B]`` int64.
    :ivar response_mask: ``[B, T]`` float32 each sample's ``loss_mask`` (all ones when unset),
        0 beyond its response.
    :ivar in_response: ``[B, T]`` bool, ``t < response_length``.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    prompt_lengths: torch.Tensor
    response_lengths: torch.Tensor
    response_mask: torch.Tensor
    in_response: torch.Tensor

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    def rows(self, index: torch.Tensor) -> PaddedBatch:
        """The samples ``index`` (``[b]`` int64), with padding columns none of them uses trimmed;
        the response width ``T`` is kept so that results line up with the whole batch."""
        lengths = self.prompt_lengths[index] + self.response_lengths[index]
        width = int(lengths.max())
        return PaddedBatch(self.input_ids[index, :width], self.attention_mask[index, :width],
                           self.prompt_lengths[index], self.response_lengths[index],
                           self.response_mask[index], self.in_response[index])


def pad_samples(samples: Sequence[Sample], pad_id: int) -> PaddedBatch:
    """Pad ``samples`` into a :class:`PaddedBatch`; errors name the offending sample."""
    check_samples(samples)
    lengths = torch.tensor([len(s.tokens) for s in samples], dtype=torch.long)
    response_lengths = torch.tensor([s.response_length for s in samples], dtype=torch.long)
    longest, width = int(lengths.max()), int(response_lengths.max())
    input_ids = pad_rows([s.tokens for s in samples], longest, fill=pad_id, dtype=torch.long)
    attention_mask = (torch.arange(longest).unsqueeze(0) < lengths.unsqueeze(1)).long()
    mask = response_mask(samples, width)
    prompt_lengths = lengths - response_lengths
    in_response = torch.arange(width).unsqueeze(0) < response_lengths.unsqueeze(1)
    return PaddedBatch(input_ids, attention_mask, prompt_lengths, response_lengths, mask, in_response)


def response_logprobs(model: Any, batch: PaddedBatch, temperature: float, *, with_entropy: bool = False,
                      place: Placement | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``model``'s log-probs (and entropy) of each response token at ``temperature``.

    Runs under the caller's grad mode. Only the logits that predict response tokens are
    normalised (``plasmid_torch.ops``, in float32, as the engines do). With ``place`` (the
    trainer's :class:`plasmid_torch.device.Placement`) the ids go to its device and the forward
    pass runs under its autocast; the results come back to the CPU (differentiably), where the
    losses' batch tensors are. Without it: the CPU, no autocast.

    :returns: ``([B, T] float32 log-probs, [B, T] float32 entropy or None)`` on the CPU, zero
        beyond each response.
    """
    input_ids, attention_mask = batch.input_ids, batch.attention_mask
    in_response, prompt_lengths = batch.in_response, batch.prompt_lengths
    autocast: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    if place is not None:
        input_ids, attention_mask = place.to_device(input_ids), place.to_device(attention_mask)
        in_response, prompt_lengths = place.to_device(in_response), place.to_device(prompt_lengths)
        autocast = place.autocast()
    with autocast:
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits               # [B, L, V]
    length, width = input_ids.shape[1], in_response.shape[1]
    # the logit at position p predicts the token at p + 1: response token t sits at prompt + t
    predicting = (prompt_lengths.unsqueeze(1) - 1 + torch.arange(width, device=input_ids.device)).clamp(
        max=length - 2)
    picked = logits.gather(1, predicting.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))      # [B, T, V]
    targets = input_ids.gather(1, predicting + 1)                                            # [B, T]
    logprobs = ops.logprobs_from_logits(picked, targets, temperature)
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    logprobs = torch.where(in_response, logprobs, zero)
    entropy = None
    if with_entropy:
        entropy = torch.where(in_response, ops.entropy_from_logits(picked, temperature), zero).cpu()
    return logprobs.cpu(), entropy
