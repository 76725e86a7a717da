"""Weights between Hugging Face names and megatron-core ``GPTModel`` parameters, per tensor-parallel shard.

Pure tensor code (no process groups): :meth:`Converter.shard` cuts the tensor-parallel rank's
piece of one megatron parameter out of Hugging Face tensors, :meth:`Converter.merge` puts the
pieces of all ranks back into Hugging Face tensors. Round trips are bit-exact: only slicing,
concatenation and zero padding.

Layouts (``t`` tensor-parallel ranks, ``g`` query groups = key/value heads, ``h`` query heads per
group, ``d`` head dim, ``H`` hidden, ``F`` FFN, ``V`` vocabulary, ``Vp`` padded vocabulary):

- ``linear_qkv.weight`` ``[g * (h + 2) * d, H]``: per group, its ``h`` query heads, then its key
  head, then its value head (megatron's interleaved GQA layout); rank ``r`` holds groups
  ``[r g/t, (r+1) g/t)``, so the ranks' pieces concatenate to the full layout. Same for the bias.
- ``linear_fc1.weight`` ``[2F, H]``: gate then up; rank ``r`` holds its rows of gate *followed
  by* its rows of up (``[gate_r; up_r]``), so the full tensor is not a plain concatenation.
- ``linear_proj.weight`` / ``linear_fc2.weight``: row-parallel, split along the input dim (1).
- ``word_embeddings`` / ``output_layer``: ``[Vp, H]``, the HF rows then zero rows up to ``Vp``,
  split along dim 0; the padding is dropped on export.
- norms (``input_layernorm``, ``pre_mlp_layernorm``, final norm, ``q/k_layernorm``): replicated.

TransformerEngine layer specs fuse the norms into the next linear layer
(``linear_qkv.layer_norm_weight``, ``linear_fc1.layer_norm_weight``); both namings are mapped.

Mixture-of-experts layers (``MoELayer`` with megatron's ``SequentialMLP`` experts; ``E`` experts,
``e`` expert-parallel ranks holding ``E / e`` each, ``u`` expert-tensor-parallel ranks):

- ``mlp.router.weight`` ``[E, H]`` = ``mlp.gate.weight``: replicated.
- ``mlp.experts.local_experts.{i}.linear_fc1`` / ``linear_fc2``: expert ``r E/e + i`` of the
  Hugging Face model on expert-parallel rank ``r`` (``mlp.experts.{r E/e + i}.{gate,up,down}_proj``),
  laid out and split like the dense MLP but over the ``u`` expert-tensor-parallel ranks (megatron's
  ``expert_tensor_parallel_size``, by default the tensor-parallel size). Such a :class:`Rule` has
  ``expert=True``; ranks are passed to :meth:`Converter.rule` (expert-parallel) and
  :meth:`Converter.shard` (expert-tensor-parallel).
- ``mlp.shared_experts.linear_fc1`` / ``linear_fc2`` = ``mlp.shared_expert.{gate,up,down}_proj``:
  split over the tensor-parallel ranks like the dense MLP; ``mlp.shared_experts.gate_weight``
  ``[1, H]`` = ``mlp.shared_expert_gate.weight``: replicated.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from plasmid_megatron.model_spec import ModelSpec

#: how a megatron parameter is split over tensor-parallel ranks
REPLICATED, QKV, GATE_UP, COLUMN, ROW, VOCAB = "replicated", "qkv", "gate_up", "column", "row", "vocab"

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")

#: per-layer parameter (megatron suffix) -> (split, Hugging Face suffixes under ``model.layers.N.``)
LAYER_PARAMETERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "input_layernorm.weight": (REPLICATED, ("input_layernorm.weight",)),
    "self_attention.linear_qkv.layer_norm_weight": (REPLICATED, ("input_layernorm.weight",)),
    "self_attention.linear_qkv.weight": (QKV, ("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                               "self_attn.v_proj.weight")),
    "self_attention.linear_qkv.bias": (QKV, ("self_attn.q_proj.bias", "self_attn.k_proj.bias",
                                             "self_attn.v_proj.bias")),
    "self_attention.q_layernorm.weight": (REPLICATED, ("self_attn.q_norm.weight",)),
    "self_attention.k_layernorm.weight": (REPLICATED, ("self_attn.k_norm.weight",)),
    "self_attention.linear_proj.weight": (ROW, ("self_attn.o_proj.weight",)),
    "pre_mlp_layernorm.weight": (REPLICATED, ("post_attention_layernorm.weight",)),
    "mlp.linear_fc1.layer_norm_weight": (REPLICATED, ("post_attention_layernorm.weight",)),
    "mlp.linear_fc1.weight": (GATE_UP, ("mlp.gate_proj.weight", "mlp.up_proj.weight")),
    "mlp.linear_fc2.weight": (ROW, ("mlp.down_proj.weight",)),
    "mlp.router.weight": (REPLICATED, ("mlp.gate.weight",)),
    "mlp.shared_experts.linear_fc1.weight": (GATE_UP, ("mlp.shared_expert.gate_proj.weight",
                                                      "mlp.shared_expert.up_proj.weight")),
    "mlp.shared_experts.linear_fc2.weight": (ROW, ("mlp.shared_expert.down_proj.weight",)),
    "mlp.shared_experts.gate_weight": (REPLICATED, ("mlp.shared_expert_gate.weight",)),
}

_LOCAL_EXPERT = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.(linear_fc1|linear_fc2)\.weight$")

#: a routed expert's megatron linear -> (split, its Hugging Face suffixes under ``mlp.experts.N.``)
EXPERT_PARAMETERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "linear_fc1": (GATE_UP, ("gate_proj.weight", "up_proj.weight")),
    "linear_fc2": (ROW, ("down_proj.weight",)),
}

EMBEDDING = "model.embed_tokens.weight"
LM_HEAD = "lm_head.weight"


@dataclass(frozen=True)
class Rule:
    """How one megatron parameter relates to Hugging Face tensors.

    :ivar split: one of ``replicated``, ``qkv``, ``gate_up``, ``column``, ``row``, ``vocab``.
    :ivar hf_names: the Hugging Face tensors it is made of, in order.
    :ivar exported: ``False`` for the tied output layer's copy on the last pipeline stage, which
        is loaded from ``embed_tokens`` but never exported (the first stage exports it).
    :ivar expert: a routed expert's weight: split over the expert-tensor-parallel ranks (not the
        tensor-parallel ones), and held by one expert-parallel rank.
    """

    split: str
    hf_names: tuple[str, ...]
    exported: bool = True
    expert: bool = False


class Converter:
    """Converts one model's weights for a tensor-parallel size ``tp_size`` (and, for a
    mixture-of-experts model, ``ep_size`` expert-parallel ranks and ``etp_size``
    expert-tensor-parallel ranks; ``None``: the tensor-parallel size, megatron's default)."""

    def __init__(self, spec: ModelSpec, tp_size: int, padded_vocab_size: int, *, ep_size: int = 1,
                 etp_size: int | None = None) -> None:
        etp_size = etp_size or tp_size
        if spec.num_kv_heads % tp_size:
            raise ValueError(f"--tensor-model-parallel-size {tp_size} must divide the model's "
                             f"{spec.num_kv_heads} key/value heads (num_key_value_heads)")
        if (spec.has_dense_layers and spec.ffn_hidden_size % tp_size) or padded_vocab_size % tp_size:
            raise ValueError(f"--tensor-model-parallel-size {tp_size} must divide intermediate_size "
                             f"{spec.ffn_hidden_size} and the padded vocabulary {padded_vocab_size}")
        if ep_size > 1 and not spec.is_moe:
            raise ValueError(f"--expert-model-parallel-size {ep_size}: the {spec.family} model has no experts to "
                             f"split; use --expert-model-parallel-size 1")
        if spec.is_moe:
            if spec.num_experts % ep_size:
                raise ValueError(f"--expert-model-parallel-size {ep_size} must divide the model's {spec.num_experts} "
                                 f"experts (num_experts)")
            if spec.moe_ffn_hidden_size % etp_size:
                raise ValueError(f"the expert-tensor-parallel size {etp_size} (--megatron-expert-tensor-parallel-size, "
                                 f"default --tensor-model-parallel-size) must divide moe_intermediate_size "
                                 f"{spec.moe_ffn_hidden_size}")
            if spec.shared_expert_ffn_hidden_size % tp_size:
                raise ValueError(f"--tensor-model-parallel-size {tp_size} must divide shared_expert_intermediate_size "
                                 f"{spec.shared_expert_ffn_hidden_size}")
        self.spec = spec
        self.tp_size = tp_size
        self.ep_size = ep_size
        self.etp_size = etp_size
        self.padded_vocab_size = padded_vocab_size

    @property
    def local_experts(self) -> int:
        """Experts per expert-parallel rank (0 for a dense model)."""
        return self.spec.num_experts // self.ep_size

    def parts(self, rule: Rule) -> int:
        """How many ranks hold a piece of the parameter: the expert-tensor-parallel size for a
        routed expert's weight, else the tensor-parallel size."""
        return self.etp_size if rule.expert else self.tp_size

    # ---------------------------------------------------------------------------------------------

    def rule(self, name: str, layer_offset: int = 0, ep_rank: int = 0) -> Rule:
        """The :class:`Rule` of megatron parameter ``name`` (as in ``GPTModel.named_parameters()``);
        ``layer_offset`` is the global index of this pipeline stage's first layer, ``ep_rank`` the
        expert-parallel rank whose local experts ``name`` refers to."""
        match = _LAYER.match(name)
        if match:
            layer, suffix = int(match.group(1)) + layer_offset, match.group(2)
            expert = _LOCAL_EXPERT.match(suffix)
            if expert:
                local, linear = int(expert.group(1)), expert.group(2)
                if not (self.spec.is_moe and 0 <= local < self.local_experts and 0 <= ep_rank < self.ep_size):
                    raise KeyError(f"megatron parameter {name!r} of expert-parallel rank {ep_rank} does not fit "
                                   f"{self.spec.num_experts} experts over {self.ep_size} expert-parallel ranks")
                split, suffixes = EXPERT_PARAMETERS[linear]
                index = ep_rank * self.local_experts + local
                return Rule(split, tuple(f"model.layers.{layer}.mlp.experts.{index}.{s}" for s in suffixes),
                            expert=True)
            if suffix not in LAYER_PARAMETERS:
                raise KeyError(f"megatron parameter {name!r} has no Hugging Face counterpart in the converter "
                               f"(plasmid_megatron.converter.LAYER_PARAMETERS)")
            split, suffixes = LAYER_PARAMETERS[suffix]
            return Rule(split, tuple(f"model.layers.{layer}.{s}" for s in suffixes))
        if name == "embedding.word_embeddings.weight":
            return Rule(VOCAB, (EMBEDDING,))
        if name == "decoder.final_layernorm.weight":
            return Rule(REPLICATED, ("model.norm.weight",))
        if name == "output_layer.weight":
            if self.spec.tie_word_embeddings:
                return Rule(VOCAB, (EMBEDDING,), exported=False)
            return Rule(VOCAB, (LM_HEAD,))
        raise KeyError(f"megatron parameter {name!r} has no Hugging Face counterpart in the converter")

    def shard(self, rule: Rule, hf: Mapping[str, torch.Tensor] | Callable[[str], torch.Tensor],
              tp_rank: int, etp_rank: int | None = None) -> torch.Tensor:
        """Rank ``tp_rank``'s piece of the parameter (expert-tensor-parallel rank ``etp_rank``'s,
        default ``tp_rank``, for a routed expert's weight), from the Hugging Face tensors ``hf``
        (a mapping, or a function from name to tensor)."""
        get = hf.__getitem__ if isinstance(hf, Mapping) else hf
        tensors = [get(name) for name in rule.hf_names]
        t = self.parts(rule)
        r = (tp_rank if etp_rank is None else etp_rank) if rule.expert else tp_rank
        if rule.split == REPLICATED:
            return tensors[0]
        if rule.split == QKV:
            return self._fused_qkv(*tensors).chunk(t, dim=0)[r].flatten(0, 1)
        if rule.split == GATE_UP:
            gate, up = tensors
            return torch.cat([gate.chunk(t, dim=0)[r], up.chunk(t, dim=0)[r]], dim=0)
        if rule.split == COLUMN:
            return tensors[0].chunk(t, dim=0)[r]
        if rule.split == ROW:
            return tensors[0].chunk(t, dim=1)[r]
        if rule.split == VOCAB:
            return self._padded_vocab(tensors[0]).chunk(t, dim=0)[r]
        raise ValueError(f"unknown split {rule.split!r}")

    def merge(self, rule: Rule, shards: list[torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
        """The Hugging Face tensors of a parameter from the pieces of all :meth:`parts` ranks (the
        tensor-parallel ones; the expert-tensor-parallel ones for a routed expert), in rank order."""
        if len(shards) != self.parts(rule):
            kind = "expert-tensor-parallel" if rule.expert else "tensor-parallel"
            raise ValueError(f"expected {self.parts(rule)} {kind} shards, got {len(shards)}")
        names = rule.hf_names
        if rule.split == REPLICATED:
            return [(names[0], shards[0])]
        if rule.split == QKV:
            return list(zip(names, self._split_qkv(torch.cat(shards, dim=0)), strict=True))
        if rule.split == GATE_UP:
            halves = [shard.chunk(2, dim=0) for shard in shards]
            gate = torch.cat([half[0] for half in halves], dim=0)
            up = torch.cat([half[1] for half in halves], dim=0)
            return [(names[0], gate), (names[1], up)]
        if rule.split == COLUMN:
            return [(names[0], torch.cat(shards, dim=0))]
        if rule.split == ROW:
            return [(names[0], torch.cat(shards, dim=1))]
        if rule.split == VOCAB:
            return [(names[0], torch.cat(shards, dim=0)[: self.spec.vocab_size])]
        raise ValueError(f"unknown split {rule.split!r}")

    # ---------------------------------------------------------------------------------------------

    def _fused_qkv(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``[g, (h + 2) d, ...]``: each group's query heads, key head, value head."""
        spec = self.spec
        groups, d = spec.num_kv_heads, spec.head_dim
        rest = q.shape[1:]
        q = q.reshape(groups, spec.heads_per_group * d, *rest)
        k = k.reshape(groups, d, *rest)
        v = v.reshape(groups, d, *rest)
        return torch.cat([q, k, v], dim=1)

    def _split_qkv(self, fused: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        spec = self.spec
        groups, d = spec.num_kv_heads, spec.head_dim
        rest = fused.shape[1:]
        grouped = fused.reshape(groups, (spec.heads_per_group + 2) * d, *rest)
        q, k, v = grouped.split([spec.heads_per_group * d, d, d], dim=1)
        return (q.reshape(groups * spec.heads_per_group * d, *rest), k.reshape(groups * d, *rest),
                v.reshape(groups * d, *rest))

    def _padded_vocab(self, weight: torch.Tensor) -> torch.Tensor:
        if weight.shape[0] != self.spec.vocab_size:
            raise ValueError(f"an embedding of {weight.shape[0]} rows for vocab_size {self.spec.vocab_size}")
        padding = self.padded_vocab_size - weight.shape[0]
        if padding == 0:
            return weight
        return torch.cat([weight, weight.new_zeros((padding, *weight.shape[1:]))], dim=0)
