"""Sequences packed into one row, without padding, for a Hugging Face causal LM (imports torch).

``S`` sequences of lengths ``l_1 .. l_S`` become one row of ``N = sum(l_i)`` tokens whose position
ids restart at 0 for each sequence (:func:`pack`), and attention stays within each sequence:

- with ``sdpa`` (the CPU default), the model's attention becomes :data:`VARLEN`
  (:func:`enable`): given the sequences' boundaries (the ``cu_seq_lens_q`` keyword that
  :func:`pack` returns and the caller passes to the forward call) it runs the causal
  scaled-dot-product attention of each sequence on its own, which costs ``sum(l_i^2)``, not
  ``N^2``, and never builds an ``[N, N]`` mask; any other call (a KV cache, a padded batch) is
  plain ``sdpa`` with its mask, unchanged;
- with ``flash_attention_2`` / ``_3`` (CUDA), transformers' own variable-length kernels read the
  same keywords.

The samples of a GRPO group share their prompt: :func:`pack_shared` packs each distinct prompt
once, followed by its samples' responses, each response attending to the whole prompt and causally
to itself (one ``[l, l]`` bool mask per group of ``l`` packed tokens, built once per forward call
and read by every layer). That feeds ``sum(P_g) + sum(R_i)`` positions instead of
``sum(P_g + R_i)``. Only :data:`VARLEN` runs it (the CUDA kernels know block-diagonal layouts only).

The results equal a padded batch's to float rounding (the tests compare log-probs, entropy and
gradients on qwen2, llama and a mixture of experts). Models with sliding-window or other
non-full attention layers are not packed (:func:`packable`).

Who calls it: plasmid-torchtrain's forward passes (``plasmid_torchtrain.batching``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

#: The attention implementation name :func:`enable` gives a model whose attention was ``sdpa``.
VARLEN = "plasmid_varlen"
#: Implementations whose kernels attend within the packed sequences themselves.
NATIVE = ("flash_attention_2", "flash_attention_3")
#: The forward-call keyword of :func:`pack_shared`'s per-group masks, read by :func:`varlen_attention`.
GROUP_MASKS = "plasmid_group_masks"


def varlen_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Transformers' attention-function signature (``query`` ``[1, heads, N, d]``, ``key`` and
    ``value`` ``[1, kv_heads, N, d]``; returns ``[1, N, heads, d]``): causal attention within each
    sequence that ``kwargs["cu_seq_lens_q"]`` (``[S + 1]`` int cumulative lengths) delimits or, with
    ``kwargs[GROUP_MASKS]`` (:func:`pack_shared`: a ``[1, 1, l, l]`` bool mask per sequence, true
    where a query may attend), as each sequence's mask says; without them, plain ``sdpa`` over
    ``attention_mask``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    bounds = kwargs.pop("cu_seq_lens_q", None)
    masks = kwargs.pop(GROUP_MASKS, None)
    if bounds is None:
        output: torch.Tensor = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                                      scaling=scaling, **kwargs)[0]
        return output, None
    for name in ("cu_seq_lens_k", "max_length_q", "max_length_k"):
        kwargs.pop(name, None)
    edges = bounds.tolist()
    parts = [sdpa_attention_forward(module, query[:, :, start:end], key[:, :, start:end], value[:, :, start:end],
                                    None if masks is None else masks[index], dropout=dropout, scaling=scaling,
                                    is_causal=masks is None, **kwargs)[0]
             for index, (start, end) in enumerate(zip(edges[:-1], edges[1:], strict=True))]
    return torch.cat(parts, dim=1), None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(VARLEN, varlen_attention)
    AttentionMaskInterface.register(VARLEN, sdpa_mask)


def attention_of(model: Any) -> str:
    """``model``'s attention implementation name (a peft model: the wrapped model's)."""
    config = getattr(model, "config", None)
    return str(getattr(config, "_attn_implementation", None) or "eager")


def packable(model: Any) -> bool:
    """Whether :func:`enable` can pack ``model``'s passes: a Hugging Face model whose every layer
    attends over the whole sequence, with ``sdpa``, :data:`VARLEN` or a :data:`NATIVE`
    implementation (``eager`` is not packed)."""
    config = getattr(model, "config", None)
    if config is None:
        return False
    layers = getattr(config, "layer_types", None) or ["full_attention"]
    return (all(kind == "full_attention" for kind in layers)
            and attention_of(model) in ("sdpa", VARLEN, *NATIVE))


def enable(model: Any) -> bool:
    """Make ``model`` (a causal LM, a base model or a peft model) take packed batches: ``sdpa``
    becomes :data:`VARLEN` (:func:`varlen_attention`; unpacked calls are unchanged). Returns
    :func:`packable`."""
    if not packable(model):
        return False
    if attention_of(model) == "sdpa":
        _register()
        target = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
        target.set_attn_implementation(VARLEN)
    return True


def pack(sequences: Sequence[Sequence[int]], device: torch.device | None = None) -> dict[str, Any]:
    """The forward-call keywords of ``sequences`` packed into one row: ``input_ids`` and
    ``position_ids`` (``[1, N]`` int64; positions restart per sequence), ``cu_seq_lens_q`` /
    ``_k`` (``[S + 1]`` int32 cumulative lengths), ``max_length_q`` / ``_k`` (the longest)."""
    lengths = [len(sequence) for sequence in sequences]
    if not lengths or min(lengths) < 1:
        raise ValueError(f"pack needs non-empty sequences, got lengths {lengths}")
    ids = torch.tensor([token for sequence in sequences for token in sequence], dtype=torch.long, device=device)
    positions = torch.cat([torch.arange(length, device=device) for length in lengths])
    bounds = torch.zeros(len(lengths) + 1, dtype=torch.int32, device=device)
    bounds[1:] = torch.tensor(lengths, device=device).cumsum(0)
    longest = max(lengths)
    return {"input_ids": ids.unsqueeze(0), "position_ids": positions.unsqueeze(0), "cu_seq_lens_q": bounds,
            "cu_seq_lens_k": bounds, "max_length_q": longest, "max_length_k": longest}


def pack_shared(groups: Sequence[tuple[Sequence[int], Sequence[Sequence[int]]]],
                device: torch.device | None = None) -> dict[str, Any]:
    """The forward-call keywords of sequences that share prompts, packed into one row: ``groups`` is
    ``[(prompt ids, [continuation ids, ...]), ...]`` (prompts non-empty, continuations possibly
    empty). Each group becomes its prompt, then its continuations one after another, and each
    continuation's position ids go on from its prompt's end, where it would sit after the prompt
    alone. The keywords are :func:`pack`'s, one sequence per group, plus :data:`GROUP_MASKS`: for
    each group a ``[1, 1, l, l]`` bool mask (``l`` its packed tokens) that lets the prompt attend
    causally to itself and each continuation to the whole prompt and causally to itself, never to
    another continuation. For :data:`VARLEN` models (:func:`varlen_attention`)."""
    ids: list[int] = []
    positions: list[torch.Tensor] = []
    masks: list[torch.Tensor] = []
    for prompt, continuations in groups:
        if not prompt:
            raise ValueError("pack_shared needs non-empty prompts")
        segment = torch.cat([torch.zeros(len(prompt), dtype=torch.long),
                             *(torch.full((len(part),), number, dtype=torch.long)
                               for number, part in enumerate(continuations, start=1))])
        positions.extend([torch.arange(len(prompt)),
                          *(torch.arange(len(prompt), len(prompt) + len(part)) for part in continuations)])
        ids.extend(prompt)
        for part in continuations:
            ids.extend(part)
        order = torch.arange(len(segment))
        # a key at or before the query, in the prompt or in the query's own continuation
        allowed = (order.unsqueeze(0) <= order.unsqueeze(1)) & (
            (segment.unsqueeze(0) == 0) | (segment.unsqueeze(0) == segment.unsqueeze(1)))
        masks.append(allowed[None, None].to(device))
    lengths = [int(mask.shape[-1]) for mask in masks]
    bounds = torch.zeros(len(lengths) + 1, dtype=torch.int32, device=device)
    bounds[1:] = torch.tensor(lengths, device=device).cumsum(0)
    return {"input_ids": torch.tensor(ids, dtype=torch.long, device=device).unsqueeze(0),
            "position_ids": torch.cat(positions).to(device).unsqueeze(0), "cu_seq_lens_q": bounds,
            "cu_seq_lens_k": bounds, "max_length_q": max(lengths), "max_length_k": max(lengths),
            GROUP_MASKS: masks}
