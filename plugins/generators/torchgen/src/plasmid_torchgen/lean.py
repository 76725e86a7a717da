"""The lean decoding step (``--torchgen-decoder lean``): one token per row over a Hugging Face
model's own weights, with a preallocated KV cache (:class:`plasmid_torchgen.kv_cache.StaticKV`).

Why: a decoding step through the Hugging Face ``forward`` grows every layer's cache with
``torch.cat`` (a copy of the whole cache per layer per step), builds a 4-D mask and the rotary
tables from scratch, and dispatches a few hundred Python calls through modules and hooks. Timed on
the tiny quickstart model at batch 256 (one thread): 2.2 ms per Hugging Face decoding step, 1.7 ms
per lean step, of which matrix products and SDPA are about 1.3 ms. This step writes each new key/value column in place,
reads the rotary ``cos``/``sin`` from a table built once, and calls the tensor functions directly.

It computes what the Hugging Face forward computes, in the same order, with the same kernels
(``F.linear``, the models' RMSNorm arithmetic, ``F.scaled_dot_product_attention`` with the
same mask and the same grouped-query packing as ``transformers.integrations.sdpa_attention``), so
on the CPU its logits are bit-identical to the Hugging Face decoding step's (the tests compare
them with ``torch.equal``) and the engine's tokens and log-probs do not change.

Supported (:func:`unsupported_reason` says why not): ``qwen2``, ``llama`` and ``qwen3`` causal
LMs with full attention in every layer, the default RoPE, the ``sdpa`` attention implementation
and a SiLU MLP: what ``plasmid_torch.tiny`` builds and the real Qwen2.5 / Llama / Qwen3 dense
models are. Any other model decodes through the Hugging Face forward.

CUDA graphs (``--torchgen-cuda-graphs``, :mod:`.graphs`): :meth:`LeanStep.fixed_shape` is the same
step with every shape fixed by the rows and the cache's capacity: it writes the new key/value column
at an index held in a device tensor (``index_copy_``) and attends over the whole capacity, the
mask's unwritten columns false, so one captured graph serves every step of a row count.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from plasmid_torchgen.kv_cache import StaticKV

#: ``config.model_type`` of the architectures the lean step implements.
LEAN_MODEL_TYPES = ("qwen2", "llama", "qwen3")


def unsupported_reason(model: Any) -> str | None:
    """Why ``model`` cannot use the lean step (one line), or ``None`` when it can."""
    config = model.config
    model_type = getattr(config, "model_type", None)
    if model_type not in LEAN_MODEL_TYPES:
        return f"model type {model_type!r} is not one of {', '.join(LEAN_MODEL_TYPES)}"
    attention = getattr(config, "_attn_implementation", None)
    if attention != "sdpa":
        return f"attention implementation {attention!r} (the lean step mirrors 'sdpa')"
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    if any(kind != "full_attention" for kind in layer_types):
        return "some layers use sliding-window attention"
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        return f"RoPE type {rope.get('rope_type')!r} (only the default RoPE)"
    if getattr(config, "hidden_act", None) != "silu":
        return f"activation {config.hidden_act!r} (only silu)"
    if getattr(config, "pretraining_tp", 1) != 1:
        return "pretraining_tp > 1"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(model, "lm_head"):
        return "the module layout is not model.model.layers / model.lm_head"
    return None


class LeanStep:
    """One decoding step of a supported model (see :func:`unsupported_reason`).

    Holds references to the model's modules, never copies of its weights, so in-place weight
    updates (``TorchEngine.update_weights``) apply from the next step. Called on the engine's
    worker thread under ``torch.inference_mode`` (and the placement's autocast).

    :param model: the served causal LM (eval mode).
    """

    def __init__(self, model: Any) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"torchgen lean decoder: {reason}")
        config = model.config
        self.model = model
        self.layers = list(model.model.layers)
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.groups = config.num_attention_heads // config.num_key_value_heads
        self.qk_norm = config.model_type == "qwen3"
        rotary = model.model.rotary_emb
        self._inv_freq = rotary.inv_freq
        self._rope_scaling = rotary.attention_scaling
        self._cos = self._sin = None

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, attention_mask: torch.Tensor,
                 cache: StaticKV) -> torch.Tensor:
        """Feed one token per row; append its keys/values to ``cache``; return the next logits.

        :param tokens: ``[rows, 1]`` int64 on the model's device, each row's pending token.
        :param positions: ``[rows, 1]`` int64 on the model's device, their position ids.
        :param attention_mask: ``[rows, columns + 1]`` int64 or bool on the model's device: the
            cache's ``columns`` columns then the new one, 1 on real tokens, 0 on left padding.
        :param cache: the rows' keys and values; must have room for one more column
            (:meth:`StaticKV.reserve`).
        :returns: ``[rows, vocab]`` logits of the next token (the model's dtype).
        """
        # The Hugging Face sdpa mask: none when no row has padding, else [rows, 1, 1, columns + 1] bool.
        mask = None if bool(attention_mask.all()) else attention_mask.bool()[:, None, None, :]
        column = cache.columns
        logits = self._forward(tokens, positions, mask, cache.keys, cache.values, column, cache.capacity)
        cache.columns = column + 1
        return logits

    def fixed_shape(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, column: torch.Tensor,
                    keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
        """The step with every shape fixed by the rows and the buffers' capacity, and nothing read
        back to the host: what :mod:`.graphs` captures as a CUDA graph.

        :param tokens: ``[rows, 1]`` int64, each row's pending token (on the model's device, as all).
        :param positions: ``[rows, 1]`` int64, their position ids.
        :param mask: ``[rows, 1, 1, capacity]`` bool, true on each row's cached real tokens and on
            the column being written; every row needs at least one true column.
        :param column: ``[1]`` int64, the column the new keys and values go to.
        :param keys: per layer ``[rows, kv_heads, capacity, head_dim]``; every column finite (the
            attention multiplies masked ones by 0).
        :param values: laid out as ``keys``.
        :returns: ``[rows, vocab]`` logits; equal to :meth:`__call__`'s up to float rounding.
        """
        return self._forward(tokens, positions, mask, keys, values, column, keys[0].shape[2])

    def _forward(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None,
                 keys: list[torch.Tensor], values: list[torch.Tensor], column: int | torch.Tensor,
                 capacity: int) -> torch.Tensor:
        embed = self.model.model.embed_tokens
        hidden = F.embedding(tokens, embed.weight, embed.padding_idx)
        cos, sin = self._rotary(positions, capacity, hidden.dtype)
        for index, layer in enumerate(self.layers):
            hidden = self._layer(layer, hidden, cos, sin, mask, keys[index], values[index], column)
        norm = self.model.model.norm
        hidden = _rms_norm(hidden, norm.weight, norm.variance_epsilon)
        head = self.model.lm_head
        return F.linear(hidden, head.weight, head.bias)[:, -1]

    def _layer(self, layer: Any, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               mask: torch.Tensor | None, keys: torch.Tensor, values: torch.Tensor,
               column: int | torch.Tensor) -> torch.Tensor:
        """One decoder layer on ``hidden`` ``[rows, 1, hidden]`` (Qwen2DecoderLayer's order of
        operations). ``column``: an int, the cached columns (attention over them and the new one),
        or a ``[1]`` device tensor (:meth:`fixed_shape`: attention over the whole capacity)."""
        attention = layer.self_attn
        rows = hidden.shape[0]
        normed = _rms_norm(hidden, layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon)
        shape = (rows, 1, -1, self.head_dim)
        query = _linear(normed, attention.q_proj).view(shape)
        key = _linear(normed, attention.k_proj).view(shape)
        value = _linear(normed, attention.v_proj).view(shape).transpose(1, 2)
        if self.qk_norm:
            query = _rms_norm(query, attention.q_norm.weight, attention.q_norm.variance_epsilon)
            key = _rms_norm(key, attention.k_norm.weight, attention.k_norm.variance_epsilon)
        query, key = _rotate(query.transpose(1, 2), cos, sin), _rotate(key.transpose(1, 2), cos, sin)
        if isinstance(column, int):
            keys[:, :, column] = key[:, :, 0]
            values[:, :, column] = value[:, :, 0]
            keys, values = keys[:, :, :column + 1], values[:, :, :column + 1]
        else:
            keys.index_copy_(2, column, key.to(keys.dtype))
            values.index_copy_(2, column, value.to(values.dtype))
        extra = {}
        if self.groups > 1:
            if mask is None and self.head_dim <= 256:
                extra["enable_gqa"] = True
            else:  # one query token: the query heads of a key/value head become its query rows
                query = query.reshape(rows, -1, self.groups, self.head_dim)
        out = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, dropout_p=0.0,
                                             scale=attention.scaling, is_causal=False, **extra)
        out = out.reshape(rows, -1, 1, self.head_dim).transpose(1, 2).contiguous()
        out = _linear(out.reshape(rows, 1, -1).contiguous(), attention.o_proj)
        hidden = hidden + out
        mlp = layer.mlp
        normed = _rms_norm(hidden, layer.post_attention_layernorm.weight,
                           layer.post_attention_layernorm.variance_epsilon)
        out = _linear(mlp.act_fn(_linear(normed, mlp.gate_proj)) * _linear(normed, mlp.up_proj), mlp.down_proj)
        return hidden + out

    def _rotary(self, positions: torch.Tensor, columns: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos``, ``sin`` ``[rows, 1, 1, head_dim]`` of ``positions`` from a table of positions
        ``0..columns-1`` (a position never exceeds the cache's columns), rebuilt when it is short.
        The table's entries are the Hugging Face rotary embedding's values exactly (the same
        elementwise product, ``cos``/``sin`` and scaling)."""
        if self._cos is None or self._cos.shape[0] < columns or self._cos.dtype != dtype:
            inv_freq = self._inv_freq.float()
            table = torch.arange(max(columns, 64), device=inv_freq.device).float()[:, None] * inv_freq
            table = torch.cat((table, table), dim=-1)
            self._cos = (table.cos() * self._rope_scaling).to(dtype)
            self._sin = (table.sin() * self._rope_scaling).to(dtype)
        return self._cos[positions].unsqueeze(1), self._sin[positions].unsqueeze(1)


def _linear(x: torch.Tensor, module: Any) -> torch.Tensor:
    return F.linear(x, module.weight, module.bias)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The Qwen2/Llama RMSNorm: in float32, then scaled by ``weight`` in the input's dtype."""
    dtype = x.dtype
    x = x.to(torch.float32)
    variance = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(variance + eps)
    return weight * x.to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` (transformers' ``apply_rotary_pos_emb``, one tensor)."""
    half = x.shape[-1] // 2
    return (x * cos) + (torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin)
