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


def varlen_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Transformers' attention-function signature (``query`` ``[1, heads, N, d]``, ``key`` and
    ``value`` ``[1, kv_heads, N, d]``; returns ``[1, N, heads, d]``): causal attention within each
    sequence that ``kwargs["cu_seq_lens_q"]`` (``[S + 1]`` int cumulative lengths) delimits; without
    it, plain ``sdpa`` over ``attention_mask``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    bounds = kwargs.pop("cu_seq_lens_q", None)
    if bounds is None:
        output: torch.Tensor = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                                      scaling=scaling, **kwargs)[0]
        return output, None
    for name in ("cu_seq_lens_k", "max_length_q", "max_length_k"):
        kwargs.pop(name, None)
    edges = bounds.tolist()
    parts = [sdpa_attention_forward(module, query[:, :, start:end], key[:, :, start:end], value[:, :, start:end],
                                    None, dropout=dropout, scaling=scaling, is_causal=True, **kwargs)[0]
             for start, end in zip(edges[:-1], edges[1:], strict=True)]
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
