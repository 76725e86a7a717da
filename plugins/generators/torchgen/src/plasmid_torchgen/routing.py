"""Mixture-of-experts routing capture of the torchgen engine (``--return-routed-experts``).

Each MoE block of a Hugging Face model (a module with a ``gate`` router and ``experts``:
Qwen2-MoE, Qwen3-MoE, ...) gets a forward hook on its router that keeps the pass's ``[tokens,
top_k]`` expert indices (transformers 5's ``TopKRouter`` returns them as its last output; a plain
``nn.Linear`` gate returns logits, whose top-k is the same choice as the top-k of their softmax).
After each forward pass the decoder hands the pass's rows to :meth:`RoutingCapture.prefilled` or
:meth:`RoutingCapture.decoded`, which cut each request's real tokens out of the ``[rows, columns]``
batch (left padding dropped) and append them to that request's routing. A token's routing is
recorded when it is fed to the model, so a response's last token (sampled, never fed) has none:
:meth:`RoutingCapture.take` returns ``len(prompt_ids) + len(token_ids) - 1`` entries, the
:data:`plasmid.types.ROUTED_EXPERTS_KEY` format the megatron trainer replays (``--routing-replay r3``).

Off unless asked: without a :class:`RoutingCapture` no hook is registered and the decoder does
nothing more per step. Everything here runs on the engine's worker thread.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from plasmid_torch.routers import chosen_experts, moe_routers


class RoutingCapture:
    """The routing of every request being decoded, captured from the model's MoE routers.

    :param model: the served causal LM; ``ValueError`` when it has no MoE block (a dense model
        routes nothing: asking for its routing is a mistake worth naming).
    :param model_path: named in that error.
    """

    def __init__(self, model: Any, model_path: str) -> None:
        routers = moe_routers(model)
        if not routers:
            raise ValueError(f"torchgen --return-routed-experts: the model at {model_path} has no mixture-of-experts "
                             f"layers (no module with a 'gate' router and 'experts'); it routes nothing to report")
        self.layers = len(routers)
        #: each MoE layer's ``[rows * columns, top_k]`` indices of the pass in progress
        self._pass: list[torch.Tensor | None] = [None] * self.layers
        #: per request (dropped with it): its ``[tokens, layers, top_k]`` int32 CPU chunks so far
        self._routes: weakref.WeakKeyDictionary[Any, list[torch.Tensor]] = weakref.WeakKeyDictionary()
        self._handles = [router.register_forward_hook(self._hook(layer, top_k))
                         for layer, (router, top_k) in enumerate(routers)]

    def _hook(self, layer: int, top_k: int) -> Any:
        def keep(module: torch.nn.Module, inputs: Any, output: Any) -> None:
            self._pass[layer] = chosen_experts(output, top_k)
        return keep

    def _batch_routes(self, rows: int) -> torch.Tensor:
        """``[rows, columns, layers, top_k]`` int32 CPU routing of the pass just run."""
        missing = [layer for layer, indices in enumerate(self._pass) if indices is None]
        if missing:
            raise RuntimeError(f"torchgen routing: MoE layers {missing} routed nothing in the last forward pass")
        stacked = torch.stack([indices for indices in self._pass if indices is not None], dim=1)
        self._pass = [None] * self.layers
        return stacked.to("cpu", torch.int32).view(rows, -1, self.layers, stacked.shape[-1])

    def prefilled(self, requests: list[Any], attention_mask: torch.Tensor, rows: list[int] | None = None) -> None:
        """After a prefill pass (``[rows, width]`` left-padded ``attention_mask``): each request's
        routing starts with its prompt tokens'. ``rows``: the pass's row of each request (requests
        with the same prompt share a row); ``None``: request ``i`` is row ``i``."""
        routes = self._batch_routes(len(attention_mask))
        for index, request in enumerate(requests):
            row = index if rows is None else rows[index]
            length = int(attention_mask[row].sum())
            self._routes[request] = [routes[row, routes.shape[1] - length:]]

    def decoded(self, requests: list[Any]) -> None:
        """After a decoding step feeding one token per row of ``requests``: append its routing."""
        routes = self._batch_routes(len(requests))
        for row, request in enumerate(requests):
            self._routes[request].append(routes[row])

    def take(self, request: Any) -> list[list[list[int]]] | None:
        """The routing of ``request``'s prompt and response tokens fed so far, as nested lists
        (``[tokens][layers][top_k]``), forgotten here; ``None`` for a request never prefilled
        (aborted while waiting)."""
        chunks = self._routes.pop(request, None)
        return None if chunks is None else torch.cat(chunks).tolist()

    def remove(self) -> None:
        """Unregister the hooks (the model routes without capture again)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []


__all__ = ["RoutingCapture", "moe_routers"]
