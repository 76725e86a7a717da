"""Mixture-of-experts settings of the megatron trainer: what it sets, what it refuses, and why.

The model's own MoE fields (experts, top-k, widths, shared expert, router order, sparse layers) come
from ``config.json`` (:meth:`plasmid_megatron.model_spec.ModelSpec.moe_config_kwargs`). This module
adds the layout-dependent ones and checks the ``--megatron-moe-*`` options a user gave against the
Hugging Face model (the engine samples from transformers' routing, so the trainer must route alike).

Token dispatcher (``moe_token_dispatcher_type``):

- ``allgather`` gathers every token of the tensor x expert-parallel group on every rank
  (``all_gather_into_tensor``) and returns the outputs with ``reduce_scatter_tensor``. Both need the
  same number of tokens on every rank of that group. Tensor-parallel ranks always agree (they hold
  the same micro-batch, or equal slices of it with sequence parallelism), but expert-parallel ranks
  are different data-parallel ranks whose micro-batches differ in length and count, so it is used
  only without expert parallelism and without pipeline parallelism (megatron refuses it with
  ``variable_seq_lengths``, which pipelining needs).
- ``alltoall`` exchanges exactly the routed tokens (``all_to_all_single`` with per-rank split
  sizes, after an ``all_gather_into_tensor`` of the per-expert token counts), so expert-parallel
  ranks may hold different numbers of tokens; used with expert or pipeline parallelism. Every
  expert-parallel rank must still run the same number of forward passes (the trainer pads with
  stand-in micro-batches). On CUDA it copies the split sizes to the host on a side stream
  (``torch.cuda.Stream``), so on a CPU-only torch it cannot even be constructed; the CPU tests give
  it stand-in streams (``tests/megatron_cpu_shim.py``). With gloo all of these collectives work
  on CPU tensors.

Load-balancing losses: none by default (megatron's ``moe_aux_loss_coeff`` is 0);
``--megatron-moe-aux-loss-coeff`` and ``--megatron-moe-z-loss-coeff`` may be given. Megatron
multiplies such a loss by the micro-batch's token count when ``calculate_per_token_loss`` is on,
expecting ``finalize_model_grads`` to divide every gradient by the update's token count; this
trainer's losses are already normalised by the update's totals and its finalize does not divide,
so :func:`build_hooks` turns the multiplication off in each router: the gradient is the
coefficient times the loss of every micro-batch (expert parallelism's stand-in micro-batches
included), summed over micro-batches and data-parallel ranks.

Tensor parallelism: megatron trains MoE layers over tensor-parallel ranks only with sequence
parallelism, which needs TransformerEngine's norms (:func:`layout_kwargs`). Routed experts are split
over the expert-tensor-parallel ranks (``--megatron-expert-tensor-parallel-size``, default the
tensor-parallel size), the shared expert over the tensor-parallel ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from plasmid_megatron import batching
from plasmid_megatron.model_spec import ModelSpec

#: ``--megatron-*`` MoE fields whose non-default value would route, weight or drop tokens
#: unlike transformers (or store experts in tensors the converter does not map): field -> reason.
INEXACT = {
    "moe_router_score_function": ("softmax", "transformers' router is a softmax"),
    "moe_router_enable_expert_bias": (False, "an expert bias that megatron learns from the load changes the "
                                             "routing and is no Hugging Face tensor"),
    "moe_router_force_load_balancing": (False, "random router logits (a benchmark mode)"),
    "moe_router_num_groups": (None, "group-limited routing (transformers routes over all experts)"),
    "moe_router_group_topk": (None, "group-limited routing (transformers routes over all experts)"),
    "moe_router_topk_limited_devices": (None, "device-limited routing (transformers routes over all experts)"),
    "moe_router_topk_scaling_factor": (None, "scaled routing probabilities"),
    "moe_input_jitter_eps": (None, "noise on the router's input in training"),
    "moe_expert_capacity_factor": (None, "a capacity factor drops tokens (transformers is dropless)"),
    "moe_pad_expert_input_to_capacity": (False, "capacity padding drops tokens (transformers is dropless)"),
    "moe_token_dropping": (False, "token dropping (transformers is dropless)"),
    "moe_apply_probs_on_input": (False, "scaling the expert's input instead of its output (silu is not linear)"),
    "moe_latent_size": (None, "latent projections around the experts (no Hugging Face tensors)"),
    "moe_grouped_gemm": (False, "grouped-GEMM experts keep their weights in tensors the converter does not map "
                                "(it maps SequentialMLP's local_experts)"),
    "moe_use_legacy_grouped_gemm": (False, "grouped-GEMM experts keep their weights in tensors the converter does "
                                           "not map"),
}


def check_options(spec: ModelSpec, native: dict[str, Any]) -> None:
    """Raise ``ValueError`` naming the option when a ``--megatron-*`` value (``native``: the
    ``TransformerConfig`` ones) would make the MoE model differ from transformers'. Nothing is
    checked for a dense model (megatron ignores its MoE fields)."""
    if not spec.is_moe:
        return
    for field, (exact, reason) in INEXACT.items():
        if field in native and native[field] != exact and not (field == "moe_expert_capacity_factor"
                                                                 and native[field] is not None
                                                                 and native[field] < 0):
            flag = "--megatron-" + field.replace("_", "-")
            raise ValueError(f"{flag} {native[field]!r}: {reason}; the megatron trainer would not reproduce the "
                             f"{spec.family} model's log-probs. Leave it unset")


def layout_kwargs(spec: ModelSpec, tp: int, pp: int, ep: int, *, transformer_engine: bool,
                  native: dict[str, Any]) -> dict[str, Any]:
    """``TransformerConfig`` fields that depend on the parallel layout, applied before the
    ``--megatron-*`` values (``native``). The dispatcher is set for dense models too: megatron 0.16
    refuses ``variable_seq_lengths`` (pipelining) with its default one even without experts.

    Tensor parallelism with experts: megatron's ``MoELayer`` refuses to train over tensor-parallel
    ranks without sequence parallelism, which its local layers (no TransformerEngine) do not have
    (``WrappedTorchNorm`` refuses it): so sequence parallelism is switched on with TransformerEngine
    and the combination is refused without it (``ValueError``)."""
    kwargs: dict[str, Any] = {"moe_token_dispatcher_type": "alltoall" if ep > 1 or pp > 1 else "allgather"}
    if spec.is_moe and tp > 1:
        if not transformer_engine:
            raise ValueError(f"--tensor-model-parallel-size {tp} with the mixture-of-experts {spec.family} model needs "
                             f"sequence parallelism, which megatron-core's local layers do not support: run with "
                             f"TransformerEngine (CUDA, transformer_engine installed), or split the experts with "
                             f"--expert-model-parallel-size and use --tensor-model-parallel-size 1")
        if native.get("sequence_parallel") is False:
            raise ValueError(f"--megatron-sequence-parallel false: megatron trains mixture-of-experts layers over "
                             f"{tp} tensor-parallel ranks only with sequence parallelism; leave it unset")
        kwargs["sequence_parallel"] = True
    return kwargs


def build_hooks(model: Any) -> None:
    """Adjust a freshly built ``GPTModel``'s routers for this trainer's loss normalisation (see
    the module docstring), and let them run without TransformerEngine (:func:`router_without_te`).
    A no-op for a model without routers."""
    from megatron.core.transformer.moe.router import Router

    routers = [module for module in model.modules() if isinstance(module, Router)]
    if routers:
        router_without_te()
    for router in routers:
        router.calculate_per_token_loss = False


def router_without_te() -> None:
    """Make megatron-core 0.16's router gating work when TransformerEngine is not installed.

    ``megatron.core.transformer.moe.moe_utils`` binds ``te_general_gemm`` only when its
    TransformerEngine import succeeds, but ``RouterGatingLinearFunction`` (every ``TopKRouter``'s
    logits) tests ``te_general_gemm is not None`` unconditionally, so without TransformerEngine
    routing raises ``NameError``. Defining the name as ``None`` selects the function's own
    ``torch.mm`` path (what the check intends); with TransformerEngine nothing changes."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def most_micro_batches(lengths: Sequence[int], rows: Sequence[int], dp_size: int, *, micro_batch_size: int,
                       max_tokens: int | None) -> int:
    """The most micro-batches any data-parallel rank makes of ``rows`` (at least 1), as the
    trainer plans them (:mod:`plasmid_megatron.batching`; no communication). With expert
    parallelism every rank runs this many forward passes, padding with stand-in micro-batches:
    each MoE layer's all-to-alls need every expert-parallel rank (other data-parallel ranks)."""
    shares = batching.shard_for_data_parallel(lengths, rows, dp_size)
    return max(1, *(len(batching.plan_micro_batches(lengths, share, micro_batch_size=micro_batch_size,
                                                    max_tokens=max_tokens)) for share in shares))
