"""Which decoder layers of a Hugging Face mixture-of-experts config are sparse (route tokens to
experts). Read by the megatron trainer (its model spec) and by engines that report routing per MoE
layer (plasmid-sglang: SGLang reports a row for every decoder layer). Imports no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def moe_layer_flags(config: Mapping[str, Any], num_layers: int, num_experts: int) -> tuple[bool, ...]:
    """``[num_layers]`` flags, true for each sparse layer of a ``config.json`` dict.

    transformers' rules: Qwen2-MoE / Qwen3-MoE (layer ``i`` is sparse when ``num_experts > 0``,
    ``i`` is not in ``mlp_only_layers`` and ``(i + 1) % decoder_sparse_step == 0``) and, where the
    config has ``first_k_dense_replace`` (DeepSeek-V2/V3), ``i >= first_k_dense_replace`` and
    ``i % moe_layer_freq == 0``."""
    if "first_k_dense_replace" in config:
        first = int(config.get("first_k_dense_replace") or 0)
        every = int(config.get("moe_layer_freq", 1) or 1)
        return tuple(num_experts > 0 and layer >= first and layer % every == 0 for layer in range(num_layers))
    step = int(config.get("decoder_sparse_step", 1) or 1)
    dense_only = {int(layer) for layer in config.get("mlp_only_layers") or ()}
    return tuple(num_experts > 0 and layer not in dense_only and (layer + 1) % step == 0
                 for layer in range(num_layers))


def config_experts(config: Mapping[str, Any]) -> int:
    """The routed-expert count of a ``config.json`` dict (``num_experts``, ``num_local_experts`` as
    transformers 5 writes Qwen3-MoE's, or ``n_routed_experts``); 0 when it names none (dense)."""
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        if config.get(key):
            return int(config[key])
    return 0


__all__ = ["config_experts", "moe_layer_flags"]
