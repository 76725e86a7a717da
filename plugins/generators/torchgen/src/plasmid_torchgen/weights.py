"""The served model's tensors by Hugging Face name: loading new values in place, reading them out.

Names are the model's ``state_dict`` names (``model.layers.0.mlp.up_proj.weight``). With tied
embeddings both ``model.embed_tokens.weight`` and ``lm_head.weight`` name one shared tensor, so
writing either updates both. A model whose MoE experts are fused (transformers 5) also takes their
checkpoint-layout names (``model.layers.0.mlp.experts.3.gate_proj.weight``), what Megatron's export
and the checkpoints send, as views into the fused tensors (:mod:`plasmid_torch.expert_layout`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from plasmid.plugins import did_you_mean
from plasmid_torch.expert_layout import expert_views


class WeightTable:
    """Name -> the model's live parameter or persistent buffer.

    :param model: the served ``torch.nn.Module``.
    :param where: how error messages name the model (its directory).
    """

    def __init__(self, model: torch.nn.Module, where: str) -> None:
        state = dict(model.state_dict(keep_vars=True))
        #: every name a sync may send: the state dict's, and per-expert views of fused experts
        self.tensors: dict[str, torch.Tensor] = {**state, **expert_views(state)}
        self.where = where

    def load(self, named_tensors: Iterable[tuple[str, Any]]) -> int:
        """Copy each ``(name, tensor or numpy array)`` into the model; returns bytes copied.

        Every name and shape is checked before anything is written, so a bad bucket changes
        nothing. Values are cast to the served dtype.
        """
        updates = [(self._target(name), name, _as_tensor(value)) for name, value in named_tensors]
        for target, name, value in updates:
            if tuple(value.shape) != tuple(target.shape):
                raise ValueError(f"torchgen update_weights: tensor '{name}' has shape {tuple(value.shape)}, but the "
                                 f"served model ({self.where}) has {tuple(target.shape)}; send the trainer's tensor "
                                 "of that name unchanged (Hugging Face layout)")
        with torch.no_grad():
            for target, _name, value in updates:
                target.copy_(value)
        return sum(value.numel() * value.element_size() for _target, _name, value in updates)

    def read(self, names: Sequence[str]) -> dict[str, np.ndarray]:
        """Copies of the named tensors as numpy arrays: the served dtype, except bfloat16 (which
        numpy lacks) read as float32 (exact)."""
        return {name: _numpy_copy(self._target(name)) for name in names}

    def _target(self, name: str) -> torch.Tensor:
        try:
            return self.tensors[name]
        except KeyError:
            example = next(iter(self.tensors), "")
            raise ValueError(f"torchgen: no tensor named '{name}' in the served model ({self.where})"
                             f"{did_you_mean(name, self.tensors)}; names are Hugging Face state_dict names "
                             f"such as '{example}'") from None


def _numpy_copy(tensor: torch.Tensor) -> np.ndarray:
    tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.float()
    return tensor.cpu().numpy().copy()


def _as_tensor(value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach()
    array = np.asarray(value)
    if not array.flags.writeable:  # torch.from_numpy warns on read-only arrays; copying is harmless
        array = array.copy()
    return torch.from_numpy(array)
