"""Samples to padded tensors, and a model's log-probs of the response tokens.

Sequences are right-padded, so every real token keeps the position it had when the engine
generated it (positions ``0 .. len - 1``) and the log-probs equal the engine's to float rounding.
Response tensors are ``[B, T]`` with ``T`` the longest response; position ``t`` of sample ``i``
is its ``t``-th response token.

Samples that share a prompt (a GRPO group) share its forward pass (:func:`response_outputs`
with ``share_prompts``; the policy's log-probs and the critic's values both go through it): the
distinct prompts run once, with a KV cache, and the responses run after them on that cache copied
to each sample's row. Autograd sums each prompt's gradient over its samples, so the outputs and
the gradients are those of one pass over the whole sequences, to float rounding (the tests compare
both), for a fraction of the tokens: on the quickstart (prompts of 5-8 tokens, responses of 2, 8
samples a prompt) the policy's forward and backward take half the time, the PPO critic's a third.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from plasmid.types import Sample
from plasmid_torch import lm_head, ops, packing
from plasmid_torch.device import Placement
from plasmid_torch.hf import cache_argument
from plasmid_torch.prompts import shared_prompts
from plasmid_torch.training import check_samples, pad_rows, response_mask
from plasmid_torch.vision import ImageInputs, VisionInputs, forward_inputs, has_images


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
    :ivar vision: each row's image inputs (:data:`plasmid_torch.vision.VISION_KEY` of its sample;
        ``None`` for a row without images), or ``None`` when no row has images.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    prompt_lengths: torch.Tensor
    response_lengths: torch.Tensor
    response_mask: torch.Tensor
    in_response: torch.Tensor
    vision: list[VisionInputs | None] | None = None

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    def prompt_groups(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(first, group)``: for each distinct prompt the row of its first sample (``[U]`` int64,
        in row order), and each row's index among the distinct prompts (``[B]`` int64); ``None``
        when no two samples share a prompt (:func:`plasmid_torch.prompts.shared_prompts`)."""
        ids = self.input_ids.tolist()
        shared = shared_prompts([row[:length] for row, length in zip(ids, self.prompt_lengths.tolist(), strict=True)])
        return None if shared is None else (torch.tensor(shared[0]), torch.tensor(shared[1]))

    def rows(self, index: torch.Tensor) -> PaddedBatch:
        """The samples ``index`` (``[b]`` int64), with padding columns none of them uses trimmed;
        the response width ``T`` is kept so that results line up with the whole batch."""
        lengths = self.prompt_lengths[index] + self.response_lengths[index]
        width = int(lengths.max())
        return PaddedBatch(self.input_ids[index, :width], self.attention_mask[index, :width],
                           self.prompt_lengths[index], self.response_lengths[index],
                           self.response_mask[index], self.in_response[index],
                           None if self.vision is None else [self.vision[i] for i in index.tolist()])


def pad_samples(samples: Sequence[Sample], pad_id: int, images: ImageInputs | None = None) -> PaddedBatch:
    """Pad ``samples`` into a :class:`PaddedBatch`; errors name the offending sample. ``images`` rebuilds
    the vision inputs of samples with images (the model's image processor); a sample with images and
    no ``images`` (a text-only model) is a :class:`ValueError` naming it."""
    check_samples(samples)
    lengths = torch.tensor([len(s.tokens) for s in samples], dtype=torch.long)
    response_lengths = torch.tensor([s.response_length for s in samples], dtype=torch.long)
    longest, width = int(lengths.max()), int(response_lengths.max())
    input_ids = pad_rows([s.tokens for s in samples], longest, fill=pad_id, dtype=torch.long)
    attention_mask = (torch.arange(longest).unsqueeze(0) < lengths.unsqueeze(1)).long()
    mask = response_mask(samples, width)
    prompt_lengths = lengths - response_lengths
    in_response = torch.arange(width).unsqueeze(0) < response_lengths.unsqueeze(1)
    if images is None:
        with_images = next((s for s in samples if has_images(s)), None)
        if with_images is not None:
            raise ValueError(f"sample {with_images.index} has images but the policy is not a vision-language model")
        vision: list[VisionInputs | None] = [None] * len(samples)
    else:
        vision = [images(s) for s in samples]
    return PaddedBatch(input_ids, attention_mask, prompt_lengths, response_lengths, mask, in_response,
                       vision if any(entry is not None for entry in vision) else None)


def response_logprobs(model: Any, batch: PaddedBatch, temperature: float, *, with_entropy: bool = False,
                      place: Placement | None = None, share_prompts: bool = False, pack: bool = False
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``model``'s log-probs (and entropy) of each response token at ``temperature``.

    Runs under the caller's grad mode. The model returns its last hidden states
    (:data:`plasmid_torch.lm_head.HIDDEN_ONLY`), and the LM head is applied to the response
    positions alone, a bounded number of tokens at a time, forward and backward
    (:func:`plasmid_torch.lm_head.token_logprobs`; normalised in float32 as the engines do), so no
    ``[tokens, vocab]`` logits of the whole micro-batch are ever held. A model without an output
    embedding returns its logits whole instead. With ``place`` (the trainer's
    :class:`plasmid_torch.device.Placement`) the ids go to its device and the passes run under its
    autocast; the results come back to the CPU (differentiably), where the losses' batch tensors
    are. Without it: the CPU, no autocast. ``share_prompts``, ``pack``: as :func:`response_outputs`.

    :returns: ``([B, T] float32 log-probs, [B, T] float32 entropy or None)`` on the CPU, zero
        beyond each response.
    """
    in_response = batch.in_response if place is None else place.to_device(batch.in_response)
    head = lm_head.LMHead.of(model)
    read, forward = (_logits, {}) if head is None else (lm_head.last_hidden, lm_head.HIDDEN_ONLY)
    with contextlib.nullcontext() if place is None else place.autocast():
        picked, targets = response_outputs(model, batch, read, place=place, share_prompts=share_prompts,
                                           pack=pack, forward=forward)
        if head is None:
            logprobs = ops.logprobs_from_logits(picked, targets, temperature)
            entropy = ops.entropy_from_logits(picked, temperature) if with_entropy else None
        else:
            logprobs, entropy = _scattered(in_response, *lm_head.token_logprobs(
                head, picked[in_response], targets[in_response], temperature, with_entropy=with_entropy))
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    logprobs = torch.where(in_response, logprobs, zero)
    if entropy is not None:
        entropy = torch.where(in_response, entropy, zero).cpu()
    return logprobs.cpu(), entropy


def _scattered(where: torch.Tensor, *values: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    """Each ``[N]`` tensor of ``values`` (``N`` the true entries of the ``[B, T]`` bool ``where``,
    in row-major order) placed into a ``[B, T]`` zero tensor, differentiably."""
    return tuple(None if value is None else torch.zeros(where.shape, dtype=value.dtype, device=value.device)
                 .masked_scatter(where, value) for value in values)


def response_outputs(model: Any, batch: PaddedBatch, read: Callable[[Any], torch.Tensor], *,
                     place: Placement | None = None, share_prompts: bool = False, pack: bool = False,
                     forward: Mapping[str, Any] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """What ``model`` outputs at the position that predicts each response token.

    Of the ways to compute it that the caller allows, the one that feeds the fewest token
    positions (:func:`choose_pass`): one padded pass over the whole sequences; the samples
    packed into one row without padding (``pack``, :mod:`plasmid_torch.packing`); or a shared pass
    of each distinct prompt followed by the responses on its KV cache (``share_prompts``).

    :param model: a Hugging Face model (causal LM, base model or peft model) taking ``input_ids``,
        ``attention_mask``, ``position_ids`` and a KV cache; called under the caller's grad mode
        and autocast.
    :param read: ``model``'s output object -> ``[rows, columns, X]`` per-position outputs (the
        last hidden states; the critic's values).
    :param place: as :func:`response_logprobs` (inputs go to its device; the results stay there).
    :param share_prompts: samples with the same prompt may share its forward pass (see the module
        docs): then two forward calls. The caller allows it only where that is fine (not for an
        FSDP2 model, whose forward calls are collectives that every rank must make alike) and the
        model keeps a KV cache while training (not with gradient checkpointing); models with
        sliding-window or other non-full attention layers always take one pass.
    :param pack: the samples may be packed into one row, when ``model`` takes packed batches
        (:func:`plasmid_torch.packing.enable` was called on it); without ``share_prompts``, a prompt
        that several samples share may be packed once (:func:`plasmid_torch.packing.pack_shared`).
    :param forward: more keyword arguments of every forward call (the policy's
        :data:`plasmid_torch.lm_head.HIDDEN_ONLY`).
    :returns: ``([B, T, X] outputs, [B, T] response token ids)``; entries beyond a response are
        those of some real position (mask them).
    """
    pack = pack and packing.packable(model)
    # the prompt packed once stands in for the KV-cache sharing where that is not allowed (gradient
    # checkpointing, FSDP2): where both are, the cache's two calls beat the packed pass's one SDPA call
    # per group on small models (the quickstart: 42-51 against 55-59 ms a step)
    pack_shared = pack and not share_prompts and packing.attention_of(model) == packing.VARLEN
    groups = batch.prompt_groups() if (share_prompts or pack_shared) and _full_attention(model) else None
    chosen = choose_pass(batch, groups, pack=pack, share_cache=share_prompts, pack_shared=pack_shared)
    forward = dict(forward or {})
    if batch.vision is not None:    # images: one padded pass, the model derives its mrope positions itself
        return _one_pass(model, read, batch, place, forward)
    if chosen == "packed":
        return _packed_pass(model, read, batch, place, forward)
    if chosen == "packed-shared":
        assert groups is not None
        return _packed_shared_pass(model, read, batch, groups, place, forward)
    if chosen == "shared":
        return _shared_prompt_passes(model, read, batch, groups, place, forward)
    return _one_pass(model, read, batch, place, forward)


def choose_pass(batch: PaddedBatch, groups: tuple[torch.Tensor, torch.Tensor] | None, *, pack: bool,
                share_cache: bool = True, pack_shared: bool = False) -> str:
    """``"padded"``, ``"packed"``, ``"packed-shared"`` or ``"shared"``: of the passes allowed, the
    one that feeds the fewest token positions: padded ``B x L``; packed (``pack``)
    ``sum(length - 1)`` (a sample's last token predicts nothing); with ``groups`` (the batch's
    shared prompts, not ``None``), packed-shared (``pack_shared``) ``sum(distinct prompt lengths) +
    sum(response length - 1)`` and shared on a KV cache (``share_cache``) ``U x longest distinct
    prompt + B x (T - 1)``. Ties go to the padded, the packed, then the packed-shared pass."""
    lengths = batch.prompt_lengths + batch.response_lengths
    costs = {"padded": batch.size * int(lengths.max())}
    if pack:
        costs["packed"] = int((lengths - 1).sum())
    if groups is not None:
        first = groups[0]
        if pack_shared:
            costs["packed-shared"] = int(batch.prompt_lengths[first].sum() + (batch.response_lengths - 1).sum())
        if share_cache:
            costs["shared"] = len(first) * int(batch.prompt_lengths[first].max()) + batch.size * (
                batch.in_response.shape[1] - 1)
    return min(costs, key=lambda name: costs[name])


def _logits(output: Any) -> torch.Tensor:
    return output.logits


def _one_pass(model: Any, read: Callable[[Any], torch.Tensor], batch: PaddedBatch,
              place: Placement | None, forward: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`response_outputs` from one forward pass over the whole sequences."""
    input_ids, attention_mask, prompt_lengths = _on(place, batch.input_ids, batch.attention_mask, batch.prompt_lengths)
    images = {} if batch.vision is None else forward_inputs(model, input_ids, batch.vision)
    outputs = read(model(input_ids=input_ids, attention_mask=attention_mask, **forward, **images))     # [B, L, X]
    length, width = input_ids.shape[1], batch.in_response.shape[1]
    # the output at position p predicts the token at p + 1: response token t sits at prompt + t
    predicting = (prompt_lengths.unsqueeze(1) - 1 + torch.arange(width, device=input_ids.device)).clamp(
        max=length - 2)
    picked = outputs.gather(1, predicting.unsqueeze(-1).expand(-1, -1, outputs.shape[-1]))   # [B, T, X]
    return picked, input_ids.gather(1, predicting + 1)


def _packed_pass(model: Any, read: Callable[[Any], torch.Tensor], batch: PaddedBatch,
                 place: Placement | None, forward: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_one_pass`'s result from one pass over the samples packed into one row
    (:func:`plasmid_torch.packing.pack`), each without its last token (it predicts nothing)."""
    lengths = batch.prompt_lengths + batch.response_lengths
    rows = batch.input_ids.tolist()
    packed = packing.pack([row[:length - 1] for row, length in zip(rows, lengths.tolist(), strict=True)],
                          None if place is None else place.device)
    outputs = read(model(**packed, **forward))[0]                                           # [N, X]
    starts = torch.cumsum(lengths - 1, 0) - (lengths - 1)
    width = batch.in_response.shape[1]
    within = (batch.prompt_lengths.unsqueeze(1) - 1 + torch.arange(width)).minimum((lengths - 2).unsqueeze(1))
    picked_at, = _on(place, starts.unsqueeze(1) + within)
    targets, = _on(place, batch.input_ids.gather(1, within + 1))
    return outputs[picked_at], targets


def _packed_shared_pass(model: Any, read: Callable[[Any], torch.Tensor], batch: PaddedBatch,
                        groups: tuple[torch.Tensor, torch.Tensor],
                        place: Placement | None, forward: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_one_pass`'s result from one pass over the batch packed with each distinct prompt once
    (:func:`plasmid_torch.packing.pack_shared`): a prompt's last output predicts its samples' first
    response token, and each sample's response tokens but the last, packed after the prompt,
    predict the rest."""
    first, group = groups
    rows = batch.input_ids.tolist()
    prompt_lengths, response_lengths = batch.prompt_lengths.tolist(), batch.response_lengths.tolist()
    members: list[list[int]] = [[] for _ in range(len(first))]
    for row, distinct in enumerate(group.tolist()):
        members[distinct].append(row)
    packed_groups = []
    prompt_last = [0] * len(first)      # per distinct prompt: where its last token sits in the packed row
    response_start = [0] * batch.size   # per sample: where its response's first fed token sits
    offset = 0
    for distinct, row in enumerate(first.tolist()):
        length = prompt_lengths[row]
        prompt_last[distinct] = offset + length - 1
        offset += length
        continuations = []
        for member in members[distinct]:
            fed = rows[member][prompt_lengths[member]:prompt_lengths[member] + response_lengths[member] - 1]
            response_start[member] = offset
            offset += len(fed)
            continuations.append(fed)
        packed_groups.append((rows[row][:length], continuations))
    packed = packing.pack_shared(packed_groups, None if place is None else place.device)
    outputs = read(model(**packed, **forward))[0]                                           # [N, X]
    width = batch.in_response.shape[1]
    steps = torch.arange(width).unsqueeze(0).minimum((batch.response_lengths - 1).unsqueeze(1))   # [B, T]
    later = torch.tensor(response_start).unsqueeze(1) + steps - 1
    at_prompt = torch.tensor(prompt_last)[group].unsqueeze(1).expand(-1, width)
    picked_at, = _on(place, torch.where(steps == 0, at_prompt, later))
    targets, = _on(place, batch.input_ids.gather(1, batch.prompt_lengths.unsqueeze(1) + steps))
    return outputs[picked_at], targets


def _shared_prompt_passes(model: Any, read: Callable[[Any], torch.Tensor], batch: PaddedBatch,
                          groups: tuple[torch.Tensor, torch.Tensor],
                          place: Placement | None, forward: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_one_pass`'s result from two passes: the ``U`` distinct prompts (right-padded, with a
    KV cache), whose last outputs predict each sample's first response token, then every sample's
    response tokens but the last on that cache, copied to the sample's row (differentiably), at
    the positions that follow its prompt. A prompt's padding columns stay masked out. With only
    one-token responses there is no second pass."""
    from transformers.cache_utils import DynamicCache

    first, group = groups
    prompt_lengths = batch.prompt_lengths
    distinct_lengths = prompt_lengths[first]
    width = int(distinct_lengths.max())
    prompt_mask = (torch.arange(width).unsqueeze(0) < distinct_lengths.unsqueeze(1)).long()
    responses_width = batch.in_response.shape[1]
    at = (prompt_lengths.unsqueeze(1) + torch.arange(responses_width)).clamp(max=batch.input_ids.shape[1] - 1)
    responses = batch.input_ids.gather(1, at)                                            # [B, T]
    prompt_ids, prompt_mask_on, last, group_on, responses = _on(
        place, batch.input_ids[first, :width], prompt_mask, distinct_lengths - 1, group, responses)
    cache = DynamicCache(config=model.config)
    cached = {cache_argument(model): cache}
    prompt_outputs = read(model(input_ids=prompt_ids, attention_mask=prompt_mask_on, use_cache=True, **cached,
                                **forward))
    first_outputs = prompt_outputs[torch.arange(len(first), device=last.device), last][group_on]   # [B, X]
    if responses_width == 1:
        return first_outputs.unsqueeze(1), responses
    cache.batch_select_indices(group_on)
    fed = responses_width - 1                   # the last response token predicts nothing
    attention_mask, positions = _on(place, torch.cat([prompt_mask[group], batch.in_response[:, :fed].long()], 1),
                                    prompt_lengths.unsqueeze(1) + torch.arange(fed))
    later = read(model(input_ids=responses[:, :fed], attention_mask=attention_mask, position_ids=positions,
                       use_cache=True, **cached, **forward))                           # [B, T - 1, X]
    return torch.cat([first_outputs.unsqueeze(1), later], 1), responses


def _full_attention(model: Any) -> bool:
    """Whether ``model`` is a Hugging Face model (or a peft one) whose every layer attends over
    the whole sequence (a KV cache then holds every prompt position, which the shared-prompt
    passes need). Other callables (the LoRA run's reference wrapper) take one pass."""
    config = getattr(model, "config", None)
    if config is None or not callable(getattr(model, "forward", None)):
        return False
    return all(kind == "full_attention" for kind in getattr(config, "layer_types", None) or ["full_attention"])


def _on(place: Placement | None, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tensors if place is None else tuple(place.to_device(tensor) for tensor in tensors)
