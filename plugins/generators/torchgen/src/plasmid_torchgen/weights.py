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
        #: the state dict's own names (tensors :meth:`share` may replace; expert views are copied into)
        self.own = frozenset(state)
        #: how many :meth:`share` calls moved a served tensor to other storage (what was recorded
        #: against the old storage, such as CUDA graphs, must then be recorded again)
        self.storage_moves = 0
        self.where = where

    def load(self, named_tensors: Iterable[tuple[str, Any]]) -> int:
        """Copy each ``(name, tensor or numpy array)`` into the model; returns bytes copied.

        Every name and shape is checked before anything is written, so a bad bucket changes
        nothing. Values are cast to the served dtype.
        """
        updates = self._checked(named_tensors)
        with torch.no_grad():
            for target, _name, value in updates:
                target.copy_(value)
        return sum(value.numel() * value.element_size() for _target, _name, value in updates)

    def _checked(self, named_tensors: Iterable[tuple[str, Any]]) -> list[tuple[torch.Tensor, str, torch.Tensor]]:
        """``(served tensor, name, value)`` for each pair; raises before anything is written when a
        name is unknown or a shape differs."""
        updates = [(self._target(name), name, _as_tensor(value)) for name, value in named_tensors]
        for target, name, value in updates:
            if tuple(value.shape) != tuple(target.shape):
                raise ValueError(f"torchgen update_weights: tensor '{name}' has shape {tuple(value.shape)}, but the "
                                 f"served model ({self.where}) has {tuple(target.shape)}; send the trainer's tensor "
                                 "of that name unchanged (Hugging Face layout)")
        return updates

    def share(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Serve each ``(name, tensor)`` itself: the model's tensor of that name takes the given
        tensor's storage (``.data``), the model's own copy is freed, and later in-place changes of the
        tensor are what the model computes with. Where dtype, device or layout differ, or the name
        is a view into fused experts, the value is copied as :meth:`load` does. Every name and shape
        is checked before anything changes; returns the bytes now shared (tensors already shared
        count, and are not touched)."""
        updates = self._checked(named_tensors)
        shared, copies, moved = 0, [], False
        with torch.no_grad():
            for target, name, value in updates:
                if self._shareable(name, target, value):
                    if target.data_ptr() != value.data_ptr():
                        target.data, moved = value, True
                    shared += value.numel() * value.element_size()
                else:
                    copies.append((name, value))
        self.load(copies)
        self.storage_moves += moved
        return shared

    def _shareable(self, name: str, target: torch.Tensor, value: torch.Tensor) -> bool:
        """Whether the model's tensor ``name`` can take ``value``'s storage: one of the state dict's
        own (not an expert view), of the same dtype and device, and ``value`` dense and contiguous."""
        return (name in self.own and target.dtype == value.dtype and target.device == value.device
                and value.is_contiguous() and not value.is_sparse)

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
