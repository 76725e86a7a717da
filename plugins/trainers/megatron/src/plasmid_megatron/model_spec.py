"""What a Hugging Face causal LM is, in the terms megatron-core's ``GPTModel`` is built from.

Read from the model directory's ``config.json`` as plain JSON (no torch, no transformers), for the
families whose layers megatron's GPT layer maps one to one:

========  ============================================  ===================================
family    ``model_type``                                what differs
========  ============================================  ===================================
llama     ``llama``, ``mistral`` (no sliding window)    no biases (``attention_bias`` false)
qwen2     ``qwen2``                                     bias on q, k, v projections
qwen3     ``qwen3``                                     RMSNorm on q and k per head, ``head_dim``
========  ============================================  ===================================

All of them: pre-norm RMSNorm, SwiGLU MLP (``silu(gate) * up``), rotary position embeddings
(``rope_type`` default, over ``partial_rotary_factor`` of each head), grouped-query attention,
tied or untied output embeddings. Anything else is refused with the reason, rather than built
into a model whose log-probs would silently differ from the engine's.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FAMILIES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}


class UnsupportedModel(ValueError):
    """The Hugging Face config describes something this trainer cannot build exactly."""


@dataclass(frozen=True)
class ModelSpec:
    """The shape of the model, independent of how it is parallelised.

    :ivar family: ``llama``, ``qwen2`` or ``qwen3`` (see the module docstring).
    :ivar vocab_size: the Hugging Face vocabulary size (rows of ``embed_tokens``).
    :ivar head_dim: channels per attention head (``kv_channels`` in megatron).
    :ivar rotary_percent: fraction of each head's channels that are rotated.
    """

    family: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    rms_norm_eps: float
    rope_theta: float
    rotary_percent: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_dropout: float = 0.0

    @property
    def qkv_bias(self) -> bool:
        return self.family == "qwen2"

    @property
    def qk_norm(self) -> bool:
        return self.family == "qwen3"

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.num_kv_heads

    def padded_vocab_size(self, divisible_by: int, tensor_parallel_size: int) -> int:
        """The embedding rows megatron holds: ``vocab_size`` rounded up to a multiple of
        ``divisible_by * tensor_parallel_size`` (as megatron-LM's ``--make-vocab-size-divisible-by``)."""
        multiple = max(1, divisible_by) * tensor_parallel_size
        return int(math.ceil(self.vocab_size / multiple) * multiple)

    def transformer_config_kwargs(self) -> dict[str, Any]:
        """The ``TransformerConfig`` fields that this model fixes (the rest are megatron's
        defaults, the trainer's, or ``--megatron-*`` options)."""
        return dict(
            num_layers=self.num_layers,
            hidden_size=self.hidden_size,
            num_attention_heads=self.num_heads,
            num_query_groups=self.num_kv_heads,
            kv_channels=self.head_dim,
            ffn_hidden_size=self.ffn_hidden_size,
            normalization="RMSNorm",
            layernorm_epsilon=self.rms_norm_eps,
            add_bias_linear=False,
            add_qkv_bias=self.qkv_bias,
            gated_linear_unit=True,
            qk_layernorm=self.qk_norm,
            attention_dropout=self.attention_dropout,
            hidden_dropout=0.0,
        )


def read_model_spec(model_dir: str | Path) -> ModelSpec:
    """The :class:`ModelSpec` of the Hugging Face model directory ``model_dir``."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise UnsupportedModel(f"--model {model_dir}: not a Hugging Face model directory (no config.json)")
    return spec_from_config(json.loads(path.read_text()), where=str(path))


def spec_from_config(config: dict[str, Any], where: str = "config.json") -> ModelSpec:
    """The :class:`ModelSpec` of a Hugging Face config dict (``config.json``'s content)."""
    model_type = config.get("model_type", "")
    if model_type not in FAMILIES:
        raise UnsupportedModel(f"{where}: model_type {model_type!r} is not supported by the megatron trainer; "
                               f"supported: {sorted(FAMILIES)}")
    family = FAMILIES[model_type]

    def refuse(reason: str) -> UnsupportedModel:
        return UnsupportedModel(f"{where}: {reason}; the megatron trainer would not reproduce this model exactly")

    if config.get("hidden_act", "silu") != "silu":
        raise refuse(f"hidden_act {config.get('hidden_act')!r} (only silu, as SwiGLU)")
    if family == "llama" and (config.get("attention_bias") or config.get("mlp_bias")):
        raise refuse("attention_bias / mlp_bias are set (biases on o_proj and the MLP are not mapped)")
    if config.get("use_sliding_window") or (model_type == "mistral" and config.get("sliding_window")):
        raise refuse("sliding-window attention is on")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) or "default"
    if rope_type != "default":
        raise refuse(f"rope_type {rope_type!r} (only 'default' rotary embeddings)")
    rope_theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))
    num_heads = int(config["num_attention_heads"])
    num_kv_heads = int(config.get("num_key_value_heads") or num_heads)
    hidden_size = int(config["hidden_size"])
    head_dim = int(config.get("head_dim") or hidden_size // num_heads)
    if num_heads % num_kv_heads:
        raise refuse(f"num_attention_heads {num_heads} is not a multiple of num_key_value_heads {num_kv_heads}")
    return ModelSpec(
        family=family,
        vocab_size=int(config["vocab_size"]),
        hidden_size=hidden_size,
        num_layers=int(config["num_hidden_layers"]),
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        ffn_hidden_size=int(config["intermediate_size"]),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        rope_theta=float(rope_theta),
        rotary_percent=float(config.get("partial_rotary_factor", 1.0)),
        max_position_embeddings=int(config.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        attention_dropout=float(config.get("attention_dropout", 0.0) or 0.0),
    )
