"""Context parallelism (``--context-parallel-size`` > 1): per-token results summed over the ranks of a sequence,
and the check that the attention megatron builds can split a sequence at all.

The layout (megatron's, as in Megatron-LM and slime): every sequence, right-padded to a multiple of
``2 * cp`` (times the tensor-parallel size with sequence parallelism), is cut into ``2 * cp`` equal chunks
and context-parallel rank ``r`` holds chunks ``r`` and ``2 * cp - 1 - r``, which balances the work of
causal attention. :mod:`plasmid_megatron.batching` cuts each micro-batch this way; ``GPTModel``'s rotary
embedding takes this rank's chunks of the positions itself (``RotaryEmbedding.forward`` ->
``get_pos_emb_on_this_cp_rank``, with ``get_rotary_seq_len`` multiplied by ``cp``), and the core attention
exchanges keys and values between the ranks.

The attention: on GPU it is TransformerEngine's ``TEDotProductAttention`` (``transformer_impl
transformer_engine``, chosen by default when TransformerEngine is installed and CUDA is available).
megatron-core's local ``DotProductAttention`` refuses ``context_parallel_size > 1`` (an assertion in its
constructor), so :func:`check_attention` turns that refusal into a :class:`~plasmid.errors.UsageError`
before anything is built. It asks the attention class the local layer spec names, so a process that
replaced it with one that accepts context parallelism (the plugin's tests do, with a CPU stand-in for
TransformerEngine's attention in ``tests/cp_attention_standin.py``) passes.

Gradients (why summing per-token results is exact): each rank computes log-probs and entropy only at
the predicting positions it holds, zeros elsewhere, and :func:`sum_over_context_parallel` adds them
over the context-parallel group (all-reduce forward, identity backward), so every rank holds the full
``[b, T]`` tensors and computes the same loss ``L``. The backward of the sum hands ``dL/d(full)`` to
every rank, and the zeros mask it down to the rank's own positions: rank ``r``'s backward covers
exactly the uses of the weights in computing its own tokens (the attention's backward returns the
key/value gradients to the ranks that computed those keys and values). Every use of a weight
happens on exactly one rank, so the sum of the ranks' weight gradients is the single-rank gradient of
``L``; megatron's ``DistributedDataParallel`` forms that sum, reducing over the data-parallel group
*with* context parallelism (``intra_dp_cp_group``, no scaling since the trainer sets
``calculate_per_token_loss``). Metrics, identical on the ranks of a sequence, are summed over the pure
data-parallel group only, so they are not counted ``cp`` times.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from plasmid.errors import UsageError


class _SumOverRanks(torch.autograd.Function):
    """All-reduce (sum) forward, identity backward (megatron's ``reduce_from_*_region`` pattern)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, group: object) -> torch.Tensor:
        summed = tensor.clone().contiguous()
        dist.all_reduce(summed, op=dist.ReduceOp.SUM, group=group)
        return summed

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def sum_over_context_parallel(tensor: torch.Tensor, group: object, size: int) -> torch.Tensor:
    """``tensor`` summed over the context-parallel ``group`` of ``size`` ranks; its gradient is passed
    through unchanged to every rank (see the module docstring). The input itself for ``size == 1``.

    Called by the trainer on ``[b, T]`` per-token log-probs/entropy that are zero where another rank
    holds the predicting position; every rank of the group must call it, in the same order."""
    if size == 1:
        return tensor
    return _SumOverRanks.apply(tensor, group)


def check_attention(spec: Any, sizes: Any, native_transformer: dict[str, Any]) -> None:
    """Refuse, with a :class:`UsageError` naming the fix, a context-parallel run whose attention cannot
    split sequences: megatron's local ``DotProductAttention`` asserts ``context_parallel_size == 1``.

    Called by the trainer before anything distributed starts, with the model's
    :class:`~plasmid_megatron.model_spec.ModelSpec`, the :class:`~plasmid_megatron.parallel.ParallelSizes`
    and the ``--megatron-*`` values of ``TransformerConfig`` fields. A no-op for ``sizes.cp == 1`` and
    with TransformerEngine's layers (``transformer_impl transformer_engine``). Otherwise it builds the
    core attention megatron's local layer specs name (``LocalSpecProvider.core_attention``, dense and
    MoE layers alike), with the run's ``TransformerConfig``, and reports its refusal.
    """
    if sizes.cp == 1:
        return
    from megatron.core.models.backends import LocalSpecProvider
    from megatron.core.transformer.enums import AttnMaskType

    from plasmid_megatron.model import transformer_config

    try:
        config = transformer_config(spec, sizes, native_transformer)
    except ValueError as exc:
        raise UsageError(f"megatron: {exc}") from None
    if config.transformer_impl == "transformer_engine":
        return
    core_attention = LocalSpecProvider().core_attention()       # what megatron's local layer specs build
    try:
        core_attention(config=config, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self",
                       cp_comm_type=config.cp_comm_type, softmax_scale=config.softmax_scale, pg_collection=None)
    except AssertionError as exc:
        raise UsageError(
            f"megatron: --context-parallel-size {sizes.cp} needs TransformerEngine's attention, which splits a "
            f"sequence over context-parallel ranks; this run builds megatron-core's local layers, whose attention "
            f"refuses it ({exc}). Run on CUDA with transformer_engine installed (chosen automatically, or "
            f"--megatron-transformer-impl transformer_engine), or use --context-parallel-size 1") from None
