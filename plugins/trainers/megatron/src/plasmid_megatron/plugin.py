"""Hook implementations of plasmid-megatron.

Neither torch nor megatron is imported here: the trainer is registered as a ``"module:attr"``
string, and the ``--megatron-*`` options are read from megatron-core's source files without
importing it (see :mod:`plasmid_megatron.native_options`).
"""

from __future__ import annotations

from plasmid import hookimpl
from plasmid.errors import UsageError
from plasmid.native_options import add_options
from plasmid_megatron.native_options import native_fields

PARALLEL_SIZES = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                  "expert_model_parallel_size")


@hookimpl
def plasmid_addoption(parser):
    group = parser.getgroup("megatron", "the megatron-core trainer (--trainer megatron)")
    group.addoption("--tensor-model-parallel-size", type=int, default=1, help="tensor-parallel ranks")
    group.addoption("--pipeline-model-parallel-size", type=int, default=1, help="pipeline stages")
    group.addoption("--context-parallel-size", type=int, default=1,
                    help="context-parallel ranks: each sequence is split over this many ranks (2 chunks each, "
                         "load-balanced for causal attention); needs TransformerEngine's attention (CUDA with "
                         "transformer_engine installed)")
    group.addoption("--expert-model-parallel-size", type=int, default=1,
                    help="expert-parallel ranks: each mixture-of-experts layer's routed experts are split over "
                         "this many (data-parallel) ranks, tokens exchanged all-to-all; must divide num_experts. "
                         "Mixture-of-experts models only (qwen2_moe, qwen3_moe); each expert's weights are split "
                         "further over --megatron-expert-tensor-parallel-size ranks (default: the tensor-parallel "
                         "size)")
    group.addoption("--max-tokens-per-micro-batch", type=int, default=None,
                    help="pack micro-batches by a budget of padded tokens (samples x longest) instead of "
                         "--micro-batch-size samples each")
    group.addoption("--make-vocab-size-divisible-by", type=int, default=128,
                    help="pad the embedding rows to a multiple of this x tensor-parallel size")

    native = parser.getgroup("megatron native", "megatron-core config fields, generated from the installed "
                             "version (TransformerConfig, OptimizerConfig, DistributedDataParallelConfig); "
                             "unset means megatron's default")
    add_options(native, native_fields())


@hookimpl
def plasmid_configure(config):
    option = config.option
    if option.trainer != "megatron":
        return
    for name in PARALLEL_SIZES:
        if getattr(option, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1")
    if option.max_tokens_per_micro_batch is not None and option.max_tokens_per_micro_batch < 1:
        raise UsageError("--max-tokens-per-micro-batch must be >= 1")
    if option.make_vocab_size_divisible_by < 1:
        raise UsageError("--make-vocab-size-divisible-by must be >= 1")


@hookimpl
def plasmid_trainers(register):
    register("megatron", "plasmid_megatron.trainer:MegatronTrainer")
