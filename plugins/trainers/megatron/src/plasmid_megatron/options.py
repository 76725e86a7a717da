"""The megatron trainer's own options (``--trainer megatron``): the parallel layout, micro-batch
packing and vocabulary padding.

megatron-core's own config fields pass through as ``--megatron-<field>``, generated from the
installed version (:mod:`plasmid_megatron.native_options`); the options every trainer shares are
:class:`plasmid_torch.trainer_options.TrainerOptions`. This module imports neither torch nor
megatron: the plugin declares it before any trainer is chosen.
"""

from __future__ import annotations

from typing import Literal

from plasmid.options import Options, option


class MegatronOptions(Options, group="megatron", description="the megatron-core trainer (--trainer megatron)"):
    """Read once by :class:`plasmid_megatron.trainer.MegatronTrainer`."""

    tensor_model_parallel_size: int = option(1, "tensor-parallel ranks", min=1)
    pipeline_model_parallel_size: int = option(1, "pipeline stages", min=1)
    context_parallel_size: int = option(
        1, "context-parallel ranks: each sequence is split over this many ranks (2 chunks each, load-balanced "
        "for causal attention); needs TransformerEngine's attention (CUDA with transformer_engine installed)",
        min=1)
    expert_model_parallel_size: int = option(
        1, "expert-parallel ranks: each mixture-of-experts layer's routed experts are split over this many "
        "(data-parallel) ranks, tokens exchanged all-to-all; must divide num_experts. Mixture-of-experts models "
        "only (qwen2_moe, qwen3_moe); each expert's weights are split further over "
        "--megatron-expert-tensor-parallel-size ranks (default: the tensor-parallel size)", min=1)
    routing_replay: Literal["none", "r2", "r3"] = option(
        "none", "mixture-of-experts routing replay (plasmid_megatron.routing_replay): r2 records each token's "
        "experts in the step's old-log-prob pass and routes every update of the step the same way; r3 routes "
        "every pass as the rollout engine did (the samples' metadata['routed_experts'], where the engine "
        "reports it); data and expert parallelism, tensor/pipeline/context-parallel size 1")
    make_vocab_size_divisible_by: int = option(128, "pad the embedding rows to a multiple of this x "
                                               "tensor-parallel size", min=1)


__all__ = ["MegatronOptions"]
