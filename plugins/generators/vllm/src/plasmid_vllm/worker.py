"""Runs inside vLLM's worker processes: ``PlasmidWorkerExtension``, mixed into each worker with
vLLM's ``--worker-extension-cls plasmid_vllm.worker.PlasmidWorkerExtension`` (plasmid's default),
so that the engine reaches it through the server's ``/collective_rpc`` (development mode).
``/collective_rpc`` passes only strings, so tensors travel as base64 text of a safetensors file.

- :meth:`plasmid_load_weights`: load ``(Hugging Face name, tensor)`` pairs (a subset is fine)
  with the model's own ``load_weights`` (which maps checkpoint names onto vLLM's fused
  parameters: ``q/k/v_proj`` into ``qkv_proj``, ``gate/up_proj`` into ``gate_up_proj``).
- :meth:`plasmid_get_weights`: the served values of Hugging Face names, cut back out of the fused
  parameters (by the layer's ``output_sizes``), for verifying a sync bit for bit.

This module imports torch and vLLM; plasmid's own process never imports it.
"""

from __future__ import annotations

import base64
import json
from typing import Any


def encode_tensors(named: dict[str, Any]) -> str:
    """``{name: torch tensor}`` as base64 text of a safetensors file (CPU copies)."""
    from safetensors.torch import save

    return base64.b64encode(save({name: t.detach().cpu().contiguous() for name, t in named.items()})).decode()


def decode_tensors(text: str) -> dict[str, Any]:
    """The inverse of :func:`encode_tensors`."""
    from safetensors.torch import load

    return load(base64.b64decode(text))


class PlasmidWorkerExtension:
    """Methods added to every vLLM worker (``self`` is the worker; ``self.model_runner`` runs the model)."""

    def _plasmid_model(self) -> Any:
        return self.model_runner.get_model()  # type: ignore[attr-defined]

    def plasmid_load_weights(self, payload: str) -> int:
        """Load the tensors of ``payload`` (:func:`encode_tensors`) into the served model; how many."""
        import torch

        model = self._plasmid_model()
        named = decode_tensors(payload)
        device = next(model.parameters()).device
        with torch.no_grad():
            model.load_weights(((name, tensor.to(device)) for name, tensor in named.items()))
        return len(named)

    def plasmid_get_weights(self, names_json: str) -> str:
        """The served values of the Hugging Face names in ``names_json`` (a JSON list), as
        :func:`encode_tensors` text; an unknown name raises ``KeyError`` naming it."""
        model = self._plasmid_model()
        params = dict(model.named_parameters())
        modules = dict(model.named_modules())
        packed: dict[str, list[str]] = dict(getattr(model, "packed_modules_mapping", {}) or {})
        out = {}
        for name in json.loads(names_json):
            out[name] = _served(name, params, modules, packed)
        return encode_tensors(out)


def _served(name: str, params: dict[str, Any], modules: dict[str, Any], packed: dict[str, list[str]]) -> Any:
    """The served tensor behind Hugging Face ``name`` (see :meth:`PlasmidWorkerExtension.plasmid_get_weights`)."""
    if name in params:
        return params[name].data
    if name == "lm_head.weight" and "model.embed_tokens.weight" in params:  # tied embeddings
        return params["model.embed_tokens.weight"].data
    parts = name.split(".")
    for fused, members in packed.items():
        for index, member in enumerate(members):
            if member in parts:
                position = parts.index(member)
                fused_name = ".".join(parts[:position] + [fused] + parts[position + 1:])
                if fused_name not in params:
                    continue
                layer = modules[".".join(parts[:position] + [fused])]
                sizes = list(getattr(layer, "output_sizes", []))
                if len(sizes) != len(members):
                    raise KeyError(f"{name}: cannot cut it out of {fused_name} (output sizes {sizes})")
                start = sum(sizes[:index])
                return params[fused_name].data.narrow(0, start, sizes[index])
    raise KeyError(f"{name} is not a weight of the served model")
