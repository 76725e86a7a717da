"""What a Hugging Face causal LM is, in the terms megatron-core's ``GPTModel`` is built from.

Read from the model directory's ``config.json`` as plain JSON (no torch, no transformers), for the
families whose layers megatron's GPT layer maps one to one:

=========  ============================================  ===================================
family     ``model_type``                                what differs
=========  ============================================  ===================================
llama      ``llama``, ``mistral`` (no sliding window)    no biases (``attention_bias`` false)
qwen2      ``qwen2``                                     bias on q, k, v projections
qwen3      ``qwen3``                                     RMSNorm on q and k per head, ``head_dim``
qwen2_moe  ``qwen2_moe``                                 as qwen2 (``qkv_bias``), mixture-of-experts
                                                         MLP with a sigmoid-gated shared expert
qwen3_moe  ``qwen3_moe``                                 as qwen3, mixture-of-experts MLP
=========  ============================================  ===================================

All of them: pre-norm RMSNorm, SwiGLU MLP (``silu(gate) * up``), rotary position embeddings
(``rope_type`` default, over ``partial_rotary_factor`` of each head), grouped-query attention,
tied or untied output embeddings. Vision-language models (a ``vision_config``: Qwen2-VL, LLaVA, ...) are
text-only here and refused naming torchtrain. Anything else is refused with the reason, rather than built
into a model whose log-probs would silently differ from the engine's.

Mixture of experts (transformers' ``Qwen2MoeSparseMoeBlock`` / ``Qwen3MoeSparseMoeBlock``), and the
megatron ``TransformerConfig`` fields that reproduce it:

- router ``mlp.gate`` (``[num_experts, hidden]``, no bias): ``softmax`` over all experts (float32),
  the ``num_experts_per_tok`` largest, divided by their sum when ``norm_topk_prob``. Megatron's
  ``TopKRouter`` with the softmax score function computes either order: ``moe_router_pre_softmax``
  (softmax over all experts, then top-k, no renormalisation) is ``norm_topk_prob`` false; its default
  (top-k of the logits, then a softmax over those k) equals the renormalised probabilities, so it is
  ``norm_topk_prob`` true. ``moe_router_topk`` = ``num_experts_per_tok``, no capacity factor (dropless,
  as transformers), no load-balancing loss unless asked for (it changes gradients, not log-probs);
- experts: SwiGLU MLPs of ``moe_intermediate_size`` (``moe_ffn_hidden_size``), each token's outputs
  weighted by its router probabilities and summed (megatron scales before ``down_proj``, which has no
  bias: the same linear map);
- qwen2_moe's shared expert: a SwiGLU MLP of ``shared_expert_intermediate_size``
  (``moe_shared_expert_intermediate_size``) applied to every token, times
  ``sigmoid(shared_expert_gate(x))`` (``moe_shared_expert_gate``), added to the experts' sum;
- which layers are sparse: layer ``i`` (0-based) is a mixture-of-experts layer when ``num_experts > 0``,
  ``i`` is not in ``mlp_only_layers`` and ``(i + 1) % decoder_sparse_step == 0``; the others are dense
  MLPs of ``intermediate_size``. Megatron's ``moe_layer_freq`` takes that pattern as a list (its integer
  form puts the first sparse layer at 0, so the list is always used).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plasmid_torch.moe_layers import moe_layer_flags

FAMILIES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen2_moe": "qwen2_moe",
            "qwen3_moe": "qwen3_moe"}
#: families whose layers may be mixture-of-experts
MOE_FAMILIES = ("qwen2_moe", "qwen3_moe")


class UnsupportedModel(ValueError):
    """The Hugging Face config describes something this trainer cannot build exactly."""


@dataclass(frozen=True)
class ModelSpec:
    """The shape of the model, independent of how it is parallelised.

    :ivar family: ``llama``, ``qwen2``, ``qwen3``, ``qwen2_moe`` or ``qwen3_moe`` (see the module docstring).
    :ivar vocab_size: the Hugging Face vocabulary size (rows of ``embed_tokens``).
    :ivar head_dim: channels per attention head (``kv_channels`` in megatron).
    :ivar ffn_hidden_size: the dense MLP's width (``intermediate_size``; the dense layers of a
        mixture-of-experts model).
    :ivar rotary_percent: fraction of each head's channels that are rotated.
    :ivar has_qkv_bias: biases on the q, k, v projections (qwen2; qwen2_moe's ``qkv_bias``).
    :ivar num_experts: routed experts per sparse layer; 0 for a dense model.
    :ivar moe_topk: experts per token (``num_experts_per_tok``).
    :ivar moe_ffn_hidden_size: each routed expert's width (``moe_intermediate_size``).
    :ivar shared_expert_ffn_hidden_size: the shared expert's width; 0 without one.
    :ivar norm_topk_prob: whether the k chosen probabilities are renormalised to sum to 1.
    :ivar moe_layers: per layer, ``True`` for a mixture-of-experts layer (all ``False`` when dense).
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
    has_qkv_bias: bool = False
    num_experts: int = 0
    moe_topk: int = 0
    moe_ffn_hidden_size: int = 0
    shared_expert_ffn_hidden_size: int = 0
    norm_topk_prob: bool = False
    moe_layers: tuple[bool, ...] = ()

    @property
    def qkv_bias(self) -> bool:
        return self.has_qkv_bias

    @property
    def qk_norm(self) -> bool:
        return self.family in ("qwen3", "qwen3_moe")

    @property
    def is_moe(self) -> bool:
        """Whether any layer is a mixture of experts (megatron builds ``MoELayer`` MLPs)."""
        return any(self.moe_layers)

    @property
    def has_dense_layers(self) -> bool:
        return not all(self.moe_layers) if self.moe_layers else True

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
            **self.moe_config_kwargs(),
        )

    def moe_config_kwargs(self) -> dict[str, Any]:
        """The mixture-of-experts ``TransformerConfig`` fields (none for a dense model); see the
        module docstring for why each value reproduces transformers' block."""
        if not self.is_moe:
            return {}
        return dict(
            num_moe_experts=self.num_experts,
            moe_router_topk=self.moe_topk,
            moe_ffn_hidden_size=self.moe_ffn_hidden_size,
            moe_router_score_function="softmax",
            moe_router_pre_softmax=not self.norm_topk_prob,
            moe_shared_expert_intermediate_size=self.shared_expert_ffn_hidden_size or None,
            moe_shared_expert_gate=self.shared_expert_ffn_hidden_size > 0,
            moe_layer_freq=[int(sparse) for sparse in self.moe_layers],
            moe_expert_capacity_factor=None,
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
    if "vision_config" in config:  # Qwen2-VL, Qwen2.5-VL, LLaVA, ...: a vision tower before the GPT layers
        raise UnsupportedModel(f"{where}: model_type {model_type!r} is a vision-language model; the megatron trainer "
                               f"builds text-only GPT models (no vision tower, no multimodal rotary positions), "
                               f"so train it with --trainer torchtrain")
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
    if family in ("qwen3", "qwen3_moe") and config.get("attention_bias"):
        raise refuse("attention_bias is set (a bias on o_proj is not mapped)")
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
    num_layers = int(config["num_hidden_layers"])
    moe = _moe_fields(config, family, num_layers, refuse) if family in MOE_FAMILIES else {}
    qkv_bias = family == "qwen2" or (family == "qwen2_moe" and bool(config.get("qkv_bias", True)))
    return ModelSpec(
        family=family,
        vocab_size=int(config["vocab_size"]),
        hidden_size=hidden_size,
        num_layers=num_layers,
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
        has_qkv_bias=qkv_bias,
        **moe,
    )


def _moe_fields(config: dict[str, Any], family: str, num_layers: int,
                refuse: Callable[[str], UnsupportedModel]) -> dict[str, Any]:
    """The :class:`ModelSpec` mixture-of-experts fields of a qwen2_moe / qwen3_moe config
    (transformers' defaults where a key is missing)."""
    # transformers 5 writes qwen3_moe's count as num_local_experts (its attribute_map), the hub as num_experts
    num_experts = config.get("num_experts", config.get("num_local_experts", 60 if family == "qwen2_moe" else 128))
    num_experts = int(num_experts or 0)
    layers = moe_layer_flags(config, num_layers, num_experts)
    if not any(layers):
        return {"moe_layers": layers}
    topk = int(config.get("num_experts_per_tok", 4 if family == "qwen2_moe" else 8))
    if not 0 < topk <= num_experts:
        raise refuse(f"num_experts_per_tok {topk} is not in 1..num_experts ({num_experts})")
    shared = 0
    if family == "qwen2_moe":
        shared = int(config.get("shared_expert_intermediate_size", 5632))
        if shared <= 0:
            raise refuse(f"shared_expert_intermediate_size {shared} (transformers builds a shared expert "
                         f"of that width in every sparse layer; megatron needs a positive width)")
    return {
        "num_experts": num_experts,
        "moe_topk": topk,
        "moe_ffn_hidden_size": int(config.get("moe_intermediate_size", 1408 if family == "qwen2_moe" else 768)),
        "shared_expert_ffn_hidden_size": shared,
        "norm_topk_prob": bool(config.get("norm_topk_prob", False)),
        "moe_layers": layers,
    }
