"""MoE routing from SGLang (``--return-routed-experts``; SGLang's ``return_routed_experts``).

A server started with ``--enable-return-routed-experts`` (plasmid sets it on the servers it
launches when routing is asked for) answers a request with ``"return_routed_experts": true`` with
``meta_info["routed_experts"]``: base64 of int32 ``[tokens, num_hidden_layers, num_experts_per_tok]``
(sglang 0.5.23, ``state_capturer/routed_experts.py``), where the tokens are every position of the
request's ``input_ids + output_ids`` but the last (``routed_experts_start_len`` 0: the whole
sequence; the last generated token is never fed to the model). Every decoder layer has a row;
the rows of dense layers were never written, so :meth:`RoutingLayout.decode` keeps the sparse
layers' (:func:`plasmid_torch.moe_layers.moe_layer_flags`): the
:data:`plasmid.types.ROUTED_EXPERTS_KEY` format, one entry per MoE layer.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from plasmid.errors import UsageError
from plasmid_torch.moe_layers import config_experts, moe_layer_flags


@dataclass(frozen=True)
class RoutingLayout:
    """How SGLang's routing of one model is laid out.

    :ivar num_layers: decoder layers (rows per token in SGLang's answer).
    :ivar top_k: experts per token. :ivar moe_layers: the sparse layers' indices, ascending.
    """

    num_layers: int
    top_k: int
    moe_layers: tuple[int, ...]

    @classmethod
    def of_model(cls, model_dir: str) -> RoutingLayout:
        """The layout of the model at ``model_dir`` (its ``config.json``; a multimodal model's
        ``text_config``); ``UsageError`` for a dense model, which routes nothing."""
        path = Path(model_dir) / "config.json"
        config = json.loads(path.read_text())
        config = config.get("text_config") or config
        experts = config_experts(config)
        layers = int(config.get("num_hidden_layers", 0))
        flags = moe_layer_flags(config, layers, experts)
        if not any(flags) or not config.get("num_experts_per_tok"):
            raise UsageError(f"engine 'sglang' --return-routed-experts: the model at {model_dir} has no "
                             f"mixture-of-experts layers ({path}); it routes nothing to report")
        return cls(layers, int(config["num_experts_per_tok"]),
                   tuple(layer for layer, sparse in enumerate(flags) if sparse))

    def decode(self, encoded: object, tokens: int) -> list[list[list[int]]]:
        """``[tokens][MoE layers][top_k]`` expert ids from ``meta_info["routed_experts"]`` of a
        request whose ``input_ids + output_ids`` are ``tokens + 1`` long; ``ValueError`` naming
        what is wrong (missing, not base64, another size)."""
        if not isinstance(encoded, str):
            raise ValueError("SGLang answered without meta_info['routed_experts']: start the server with "
                             "--enable-return-routed-experts (--sglang-enable-return-routed-experts)")
        try:
            raw = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"SGLang's meta_info['routed_experts'] is not base64: {exc}") from None
        per_token = self.num_layers * self.top_k
        values = np.frombuffer(raw, dtype=np.int32)
        if values.size != tokens * per_token:
            raise ValueError(f"SGLang's meta_info['routed_experts'] holds {values.size} int32 values; expected "
                             f"{tokens} tokens x {self.num_layers} layers x top-{self.top_k} = {tokens * per_token}")
        routed = values.reshape(tokens, self.num_layers, self.top_k)[:, list(self.moe_layers)]
        return routed.tolist()


__all__ = ["RoutingLayout"]
