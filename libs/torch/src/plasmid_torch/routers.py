"""The routers of a Hugging Face mixture-of-experts model and the experts each one chose: read by
the torchgen engine's routing capture (``--return-routed-experts``) and by ``plasmid parity``
(which compares an engine's routing with a trainer's)."""

from __future__ import annotations

from typing import Any

import torch


def moe_routers(model: Any) -> list[tuple[torch.nn.Module, int]]:
    """``(router, top_k)`` of each MoE block of ``model``, in layer order (empty for a dense model).

    A block is a module with ``gate`` and ``experts`` children; ``top_k`` is the router's own
    ``top_k``, the block's, or the model config's ``num_experts_per_tok``; ``ValueError`` when none."""
    default_top_k = getattr(getattr(model, "config", None), "num_experts_per_tok", None)
    routers = []
    for module in model.modules():
        gate = getattr(module, "gate", None)
        if isinstance(gate, torch.nn.Module) and isinstance(getattr(module, "experts", None), torch.nn.Module):
            top_k = getattr(gate, "top_k", None) or getattr(module, "top_k", None) or default_top_k
            if not top_k:
                raise ValueError(f"the MoE block {type(module).__name__} has no top_k (router attribute or "
                                 f"config.num_experts_per_tok)")
            routers.append((gate, int(top_k)))
    return routers


def chosen_experts(output: Any, top_k: int) -> torch.Tensor:
    """``[tokens, top_k]`` expert indices from a router's forward ``output``: transformers 5's
    ``TopKRouter`` returns them as its last output; a plain ``nn.Linear`` gate (or a router whose
    outputs are all floating point) returns logits first, whose top-k is the same choice as the
    top-k of their softmax."""
    if isinstance(output, tuple):
        indices = output[-1]
        if indices.is_floating_point():
            indices = output[0].topk(top_k, dim=-1).indices
    else:
        indices = output.topk(top_k, dim=-1).indices
    return torch.as_tensor(indices).reshape(-1, top_k)


__all__ = ["chosen_experts", "moe_routers"]
