"""Mixture-of-experts weights in their two Hugging Face layouts (imports torch).

transformers 5 modules hold each MoE layer's routed experts fused, one tensor per projection:

- ``<layer>.mlp.experts.gate_up_proj``: ``[experts, 2 * intermediate, hidden]``, each expert's gate
  projection in rows ``[:intermediate]`` and its up projection in rows ``[intermediate:]``;
- ``<layer>.mlp.experts.down_proj``: ``[experts, hidden, intermediate]``.

Checkpoints (``save_pretrained`` writes them so; ``from_pretrained`` fuses them on load), SGLang,
vLLM and Megatron's export name each expert's matrices apart, the *checkpoint layout*:
``<layer>.mlp.experts.<e>.gate_proj.weight`` and ``up_proj.weight`` (``[intermediate, hidden]``) and
``down_proj.weight`` (``[hidden, intermediate]``). This is the layout of Qwen2-MoE, Qwen3-MoE and the
models transformers converts like them (DeepSeek, OLMoE, ...); tensors of other names pass through.

Weight syncs speak the checkpoint layout (:mod:`plasmid.protocols`: "named Hugging Face tensors"):
a trainer whose module is fused splits on export (:func:`checkpoint_layout`), an engine whose module
is fused takes per-expert names as views into its fused tensors (:func:`expert_views`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

import torch

#: suffixes of the fused tensors: ``<prefix>.mlp.experts.<suffix>``
GATE_UP, DOWN = "mlp.experts.gate_up_proj", "mlp.experts.down_proj"


def split_expert_tensor(name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]] | None:
    """The checkpoint-layout ``(name, view)`` pairs of a fused expert tensor, in expert order (gate,
    up per expert for ``gate_up_proj``); ``None`` for any other tensor. Views share ``tensor``'s
    storage: writing into them writes into ``tensor``."""
    if tensor.dim() != 3:
        return None
    if name.endswith(GATE_UP):
        prefix = name[: -len("gate_up_proj")]
        intermediate = tensor.shape[1] // 2
        return [pair for expert in range(tensor.shape[0])
                for pair in ((f"{prefix}{expert}.gate_proj.weight", tensor[expert, :intermediate]),
                             (f"{prefix}{expert}.up_proj.weight", tensor[expert, intermediate:]))]
    if name.endswith(DOWN):
        prefix = name[: -len("down_proj")]
        return [(f"{prefix}{expert}.down_proj.weight", tensor[expert]) for expert in range(tensor.shape[0])]
    return None


def checkpoint_layout(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """``named_tensors`` with every fused expert tensor replaced by its per-expert views (in place
    of it, in order); every other tensor unchanged."""
    for name, tensor in named_tensors:
        split = split_expert_tensor(name, tensor)
        if split is None:
            yield name, tensor
        else:
            yield from split


def expert_views(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Checkpoint-layout name -> view into the fused tensor, for every fused expert tensor of
    ``tensors`` (a module's ``state_dict``); empty for a model without fused experts."""
    views: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        views.update(split_expert_tensor(name, tensor) or ())
    return views
