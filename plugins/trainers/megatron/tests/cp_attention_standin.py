"""TEST SUPPORT ONLY: a CPU stand-in for TransformerEngine's context-parallel core attention. Never imported
by the product.

With ``--context-parallel-size`` > 1 the megatron trainer needs TransformerEngine's ``TEDotProductAttention``
(GPU only, not installable on the CPU test machines); megatron-core's local ``DotProductAttention`` asserts
``context_parallel_size == 1``. :func:`install` makes megatron's local layer spec build
:class:`ContextParallelAttention` instead when the config has ``context_parallel_size > 1`` (megatron's own
``DotProductAttention`` otherwise, so the other layouts keep testing megatron's attention). The trainer
then finds that the local spec's attention accepts context parallelism and runs
(``plasmid_megatron.context_parallel.check_attention``).

What it computes is plain causal attention over the whole sequence, split the way megatron splits it:
rank ``r`` of ``cp`` holds chunks ``r`` and ``2 * cp - 1 - r`` of ``2 * cp`` equal chunks (its queries,
keys and values, rotary embedding already applied by megatron). Keys and values are all-gathered over
the context-parallel group; a query at global position ``i`` attends to the keys at global positions
``<= i``. The gather's backward sums the key/value gradients of every rank and gives each rank those
of its own tokens (a reduce-scatter), as TransformerEngine's ring attention does. It is written for
clarity, not speed (the full ``[s_local, S]`` score matrix, float32 softmax); no attention masks other
than causal, no packed sequences, no attention bias.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

_megatron_attention: Any = None


def held_positions(local_length: int, cp_size: int, cp_rank: int) -> torch.Tensor:
    """``[local_length]`` int64 global positions of rank ``cp_rank``'s tokens (its two chunks, in order)."""
    if cp_size == 1:
        return torch.arange(local_length)
    assert local_length % 2 == 0, f"a context-parallel rank holds two equal chunks, got {local_length} tokens"
    chunk = local_length // 2
    last = 2 * cp_size - 1 - cp_rank
    return torch.cat([torch.arange(cp_rank * chunk, (cp_rank + 1) * chunk), torch.arange(last * chunk,
                                                                                         (last + 1) * chunk)])


class _GatherSequence(torch.autograd.Function):
    """``[s_local, ...]`` of every rank concatenated in rank order (``[cp * s_local, ...]``); backward:
    the gradient summed over ranks, this rank's slice (reduce-scatter, with collectives gloo has)."""

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, group: Any, size: int, rank: int) -> torch.Tensor:
        ctx.group, ctx.rank, ctx.local_length = group, rank, local.shape[0]
        pieces = [torch.empty_like(local) for _ in range(size)]
        dist.all_gather(pieces, local.contiguous(), group=group)
        return torch.cat(pieces, dim=0)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        summed = grad.contiguous().clone()
        dist.all_reduce(summed, op=dist.ReduceOp.SUM, group=ctx.group)
        start = ctx.rank * ctx.local_length
        return summed[start:start + ctx.local_length], None, None, None


class ContextParallelAttention(torch.nn.Module):
    """Causal core attention over a sequence split across the context-parallel group (see the module
    docstring). Takes megatron's core-attention constructor arguments; ``forward(query, key, value,
    attention_mask, ...)`` with ``query`` ``[s_local, b, heads, d]``, ``key``/``value``
    ``[s_local, b, groups, d]`` returns ``[s_local, b, heads * d]``."""

    def __init__(self, config: Any, layer_number: int, attn_mask_type: Any, attention_type: str,
                 attention_dropout: float | None = None, softmax_scale: float | None = None,
                 cp_comm_type: str | None = None, pg_collection: Any = None) -> None:
        from megatron.core.transformer.enums import AttnMaskType

        super().__init__()
        if attn_mask_type != AttnMaskType.causal:
            raise NotImplementedError(f"the CPU context-parallel attention stand-in is causal only, got "
                                      f"{attn_mask_type}")
        self.config = config
        self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(config.kv_channels)
        self.pg_collection = pg_collection
        self.dropout = torch.nn.Dropout(config.attention_dropout if attention_dropout is None else attention_dropout)

    def _group(self) -> Any:
        if self.pg_collection is not None and getattr(self.pg_collection, "cp", None) is not None:
            return self.pg_collection.cp
        from megatron.core import parallel_state

        return parallel_state.get_context_parallel_group()

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any,
                attn_mask_type: Any = None, attention_bias: Any = None, packed_seq_params: Any = None) -> torch.Tensor:
        if attention_mask is not None or attention_bias is not None or packed_seq_params is not None:
            raise NotImplementedError("the CPU context-parallel attention stand-in takes no attention mask, "
                                      "bias or packed sequences (causal masking is built in)")
        group = self._group()
        size, rank = group.size(), group.rank()
        local_length, batch, heads, _ = query.shape
        keys = _GatherSequence.apply(key, group, size, rank)
        values = _GatherSequence.apply(value, group, size, rank)
        if heads != keys.shape[2]:                                  # grouped-query attention
            keys = keys.repeat_interleave(heads // keys.shape[2], dim=2)
            values = values.repeat_interleave(heads // values.shape[2], dim=2)
        query_positions = held_positions(local_length, size, rank).to(query.device)
        key_positions = torch.cat([held_positions(local_length, size, r) for r in range(size)]).to(query.device)
        scores = torch.einsum("sbhd,tbhd->bhst", query.float(), keys.float()) * self.softmax_scale
        future = key_positions.unsqueeze(0) > query_positions.unsqueeze(1)          # [s_local, S]
        scores = scores.masked_fill(future, float("-inf"))
        probs = self.dropout(torch.softmax(scores, dim=-1)).to(values.dtype)
        context = torch.einsum("bhst,tbhd->sbhd", probs, values)
        return context.reshape(local_length, batch, -1)


def core_attention(**kwargs: Any) -> torch.nn.Module:
    """The core attention megatron's local layer spec builds once :func:`install` ran: the stand-in
    with ``context_parallel_size > 1``, megatron's ``DotProductAttention`` otherwise."""
    if kwargs["config"].context_parallel_size > 1:
        return ContextParallelAttention(**kwargs)
    return _megatron_attention(**kwargs)


def install() -> None:
    """Make megatron's local layer spec (``LocalSpecProvider.core_attention``) name :func:`core_attention`
    (idempotent; test processes only)."""
    global _megatron_attention
    import megatron.core.models.backends as backends

    if backends.DotProductAttention is core_attention:
        return
    _megatron_attention = backends.DotProductAttention
    backends.DotProductAttention = core_attention
