"""A model's weights in Hugging Face names, in byte-bounded buckets (what weight syncs send).

Names are the checkpoint's: a MoE model's fused experts (transformers 5 modules) go out one tensor
per expert and projection, as ``save_pretrained`` writes them and SGLang, vLLM and Megatron name them.

A tensor of an FSDP2-sharded model is gathered whole when its bucket is copied, so a rank holds
at most one bucket of whole tensors beside its shards (never the whole model).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from plasmid_torch.expert_layout import checkpoint_layout

NamedTensor = tuple[str, torch.Tensor]


def hf_named_tensors(model: Any) -> Iterator[NamedTensor]:
    """The model's state dict as it is saved by ``save_pretrained``: every tensor once.

    Tied tensors (``lm_head.weight`` sharing ``model.embed_tokens.weight``) appear under the
    first name only; a receiver built from the same config ties them again, as loading the
    checkpoint does. Tensors are detached views of the live weights (not copies).
    """
    seen: set[tuple[int, tuple[int, ...]]] = set()
    for name, tensor in model.state_dict().items():
        key = (tensor.data_ptr(), tuple(tensor.shape))
        if key in seen:
            continue
        seen.add(key)
        yield name, tensor.detach()


def tensor_bytes(tensor: Any) -> int:
    """Bytes of a tensor's data (``numel * element size``)."""
    return int(tensor.numel() * tensor.element_size())


def buckets(named_tensors: Iterable[NamedTensor], bucket_bytes: int) -> Iterator[list[NamedTensor]]:
    """Group ``named_tensors`` in order into lists of at most ``bucket_bytes`` bytes each.

    A tensor larger than ``bucket_bytes`` is a bucket of its own. Each tensor is copied
    (contiguous, on CPU) when its bucket is yielded, so a receiver may keep it and later
    updates of the model do not change it; at most one bucket of copies is alive at a time
    on the sending side.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes} (--update-weight-buffer-size)")
    pending: list[NamedTensor] = []
    pending_bytes = 0
    for name, tensor in named_tensors:
        size = tensor_bytes(tensor)
        if pending and pending_bytes + size > bucket_bytes:
            yield _copied(pending)
            pending, pending_bytes = [], 0
        pending.append((name, tensor))
        pending_bytes += size
    if pending:
        yield _copied(pending)


def _copied(bucket: list[NamedTensor]) -> list[NamedTensor]:
    """CPU copies of a bucket's tensors, in the checkpoint layout (fused MoE experts split per expert,
    :func:`plasmid_torch.expert_layout.checkpoint_layout`: what engines and checkpoints name); a sharded
    (DTensor) one is first gathered whole (a collective: every rank exports the same buckets), one
    tensor at a time."""
    return list(checkpoint_layout((name, _whole(tensor).detach().to("cpu", copy=True).contiguous())
                                  for name, tensor in bucket))


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    full_tensor = getattr(tensor, "full_tensor", None)
    return full_tensor() if callable(full_tensor) else tensor


def named_tensors(model: Any, names: list[str]) -> Iterator[NamedTensor]:
    """The model's state-dict tensors ``names`` (as :func:`hf_named_tensors` listed them before the
    model was sharded: a sharded model's DTensors have no shared storage to tell tied ones by)."""
    state = model.state_dict()
    for name in names:
        yield name, state[name].detach()
