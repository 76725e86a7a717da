"""Building megatron-core's ``GPTModel`` from a Hugging Face model directory, and its weights in and out.

:func:`transformer_config` turns a :class:`~plasmid_megatron.model_spec.ModelSpec` plus the run's
options into a ``TransformerConfig``; :func:`build_gpt_model` builds this rank's pipeline stage with
the local layer spec, or TransformerEngine's when it is installed and CUDA is available
(``--megatron-transformer-impl`` chooses explicitly); :func:`load_hf_weights` copies the Hugging
Face safetensors into it; :func:`export_hf_weights` streams the weights back in Hugging Face names,
gathered over tensor- and pipeline-parallel ranks (a collective: every rank iterates it).

Settings the trainer chooses unless a ``--megatron-*`` option says otherwise: no dropout besides
the model's own ``attention_dropout``, fusions off unless TransformerEngine is used (they need
CUDA kernels), initialisation on the CPU without CUDA. Every parameter is then overwritten from the
checkpoint (vocabulary padding rows with zeros); the random initialisation is kept because megatron
marks tensor-parallel parameters while initialising them (without it the gradient norm silently
counts one rank's shards only).
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from plasmid_megatron import moe
from plasmid_megatron.converter import Converter, Rule
from plasmid_megatron.model_spec import ModelSpec
from plasmid_megatron.parallel import Groups, ParallelSizes, all_gather

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def uses_transformer_engine(native: dict[str, Any]) -> bool:
    """Whether to build with TransformerEngine layers: ``--megatron-transformer-impl`` when given,
    else when ``transformer_engine`` is importable and CUDA is available."""
    chosen = native.get("transformer_impl")
    if chosen is not None:
        return chosen == "transformer_engine"
    return torch.cuda.is_available() and importlib.util.find_spec("transformer_engine") is not None


def with_dtypes(values: dict[str, Any]) -> dict[str, Any]:
    """``--megatron-*`` values with dtype names (``*dtype`` fields) turned into ``torch.dtype``."""
    return {name: DTYPES[value] if name.endswith("dtype") and isinstance(value, str) else value
            for name, value in values.items()}


def params_dtype(native_transformer: dict[str, Any]) -> torch.dtype:
    if native_transformer.get("bf16"):
        return torch.bfloat16
    if native_transformer.get("fp16"):
        return torch.float16
    return torch.float32


def transformer_config(spec: ModelSpec, sizes: ParallelSizes, native: dict[str, Any]) -> Any:
    """The ``TransformerConfig`` of ``spec`` laid out as ``sizes``, with ``native``
    (``--megatron-*`` values of ``TransformerConfig`` fields) applied last."""
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    from plasmid_megatron.native_options import check_against

    check_against(TransformerConfig, native)
    moe.check_options(spec, native)
    te = uses_transformer_engine(native)
    dtype = params_dtype(native)
    kwargs: dict[str, Any] = {
        **spec.transformer_config_kwargs(),
        "activation_func": F.silu,
        "tensor_model_parallel_size": sizes.tp,
        "pipeline_model_parallel_size": sizes.pp,
        "context_parallel_size": sizes.cp,
        "expert_model_parallel_size": sizes.ep,
        "expert_tensor_parallel_size": sizes.etp,
        "params_dtype": dtype,
        "pipeline_dtype": dtype if sizes.pp > 1 else None,
        "variable_seq_lengths": sizes.pp > 1,
        # the MoE token dispatcher (set for dense models too) and sequence parallelism for MoE with TP
        **moe.layout_kwargs(spec, sizes.tp, sizes.pp, sizes.ep, transformer_engine=te, native=native),
        "calculate_per_token_loss": True,
        "transformer_impl": "transformer_engine" if te else "local",
        "use_cpu_initialization": not torch.cuda.is_available(),
        "attention_softmax_in_fp32": True,
        "apply_query_key_layer_scaling": False,
    }
    kwargs.update(with_dtypes(native))
    return TransformerConfig(**kwargs)


def gpt_layer_spec(spec: ModelSpec, config: Any) -> Any:
    """The transformer layer's ``ModuleSpec``: TransformerEngine's with ``transformer_impl
    transformer_engine``, else megatron-core's local one (RMSNorm, qk-norm as the model has it).

    For a mixture-of-experts model, the block spec of this pipeline stage's layers instead
    (megatron's ``get_gpt_decoder_block_spec``): per layer, following ``config.moe_layer_freq``, the
    layer spec above with ``num_experts=config.num_moe_experts`` (``MoELayer``: router, megatron's
    ``SequentialMLP`` experts since ``moe_grouped_gemm`` is off, shared experts when configured) or
    the dense one."""
    if spec.is_moe:
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

        te = config.transformer_impl == "transformer_engine"
        return get_gpt_decoder_block_spec(config, use_transformer_engine=te, normalization="RMSNorm")
    if config.transformer_impl == "transformer_engine":
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

        return get_gpt_layer_with_transformer_engine_spec(qk_layernorm=spec.qk_norm)
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    return get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=spec.qk_norm)


def build_gpt_model(spec: ModelSpec, config: Any, padded_vocab_size: int) -> Any:
    """This rank's stage of the ``GPTModel`` (uninitialised weights; load them next)."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel

    model = GPTModel(
        config=config,
        transformer_layer_spec=gpt_layer_spec(spec, config),
        vocab_size=padded_vocab_size,
        max_sequence_length=spec.max_position_embeddings,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        parallel_output=True,
        share_embeddings_and_output_weights=spec.tie_word_embeddings,
        position_embedding_type="rope",
        rotary_percent=spec.rotary_percent,
        rotary_base=spec.rope_theta,
    )
    moe.build_hooks(model)
    if torch.cuda.is_available():
        model.cuda(torch.cuda.current_device())
    return model


def in_training_precision(model: Any, config: Any) -> Any:
    """``model`` ready for training in ``config``'s precision: unchanged in float32; with
    ``bf16``/``fp16``, wrapped in megatron's ``Float16Module`` (as Megatron-LM does), which casts
    every parameter (norms, value heads) to that dtype, floating inputs of the first stage to it and
    the last stage's output back to float32. Megatron's local layers create their norms in float32
    whatever ``params_dtype`` says, and its mixed-precision optimizer and checkpoints need one
    dtype for all trained parameters. Call it after the weights are loaded, before DDP."""
    if not (config.bf16 or config.fp16):
        return model
    from megatron.core.transformer.module import Float16Module

    return Float16Module(config, model)


def layer_offset(model: Any) -> int:
    """The global index of this stage's first transformer layer (0 without layers)."""
    layers = getattr(getattr(model, "decoder", None), "layers", None)
    return int(layers[0].layer_number) - 1 if layers is not None and len(layers) else 0


def unwrapped(model: Any) -> Any:
    """The ``GPTModel`` inside megatron's DDP (or similar) wrappers."""
    while hasattr(model, "module"):
        model = model.module
    return model


# -------------------------------------------------------------------------------------------------
# Hugging Face weights in
# -------------------------------------------------------------------------------------------------


def hf_tensor_reader(model_dir: str | Path) -> Callable[[str], torch.Tensor]:
    """``name -> tensor`` over the safetensors files of a Hugging Face model directory
    (single file or sharded with ``model.safetensors.index.json``), read lazily."""
    from safetensors import safe_open

    directory = Path(model_dir)
    index_file = directory / "model.safetensors.index.json"
    if index_file.is_file():
        weight_map = json.loads(index_file.read_text())["weight_map"]
        files = {name: directory / file for name, file in weight_map.items()}
    else:
        files = {}
        for file in sorted(directory.glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as handle:
                files.update(dict.fromkeys(handle.keys(), file))
    if not files:
        raise FileNotFoundError(f"{directory}: no *.safetensors weights (the megatron trainer loads safetensors)")

    def read(name: str) -> torch.Tensor:
        if name not in files:
            raise KeyError(f"{directory}: the Hugging Face checkpoint has no tensor {name!r}")
        with safe_open(str(files[name]), framework="pt") as handle:
            return handle.get_tensor(name)

    return read


@torch.no_grad()
def load_hf_weights(model: Any, converter: Converter, read: Callable[[str], torch.Tensor], tp_rank: int, *,
                    ep_rank: int | None = None, etp_rank: int | None = None) -> None:
    """Copy every parameter of this rank's ``model`` from the Hugging Face tensors ``read`` gives.

    ``tp_rank``: this rank's tensor-parallel rank; ``ep_rank`` / ``etp_rank``: its expert-parallel
    and expert-tensor-parallel ranks (which experts, and which piece of each, it holds); by default
    megatron's parallel state's, read only when the model has routed experts."""
    model = unwrapped(model)
    offset = layer_offset(model)
    ranks: tuple[int, int] | None = None if ep_rank is None or etp_rank is None else (ep_rank, etp_rank)
    for name, param in model.named_parameters():
        if ranks is None and _LOCAL_EXPERT_PARAMETER in name:
            ranks = _expert_ranks(ep_rank, etp_rank)
        expert_rank, expert_tp_rank = ranks or (0, tp_rank)
        value = converter.shard(converter.rule(name, offset, expert_rank), read, tp_rank, expert_tp_rank)
        if tuple(value.shape) != tuple(param.shape):
            raise ValueError(f"megatron parameter {name} has shape {tuple(param.shape)} but the converted Hugging "
                             f"Face tensor has {tuple(value.shape)}: --model's config.json and weights disagree")
        param.data.copy_(value.to(dtype=param.dtype))


#: in the names of routed experts' parameters (megatron's SequentialMLP)
_LOCAL_EXPERT_PARAMETER = ".mlp.experts.local_experts."


def _expert_ranks(ep_rank: int | None, etp_rank: int | None) -> tuple[int, int]:
    from megatron.core import parallel_state

    return (parallel_state.get_expert_model_parallel_rank() if ep_rank is None else ep_rank,
            parallel_state.get_expert_tensor_parallel_rank() if etp_rank is None else etp_rank)


# -------------------------------------------------------------------------------------------------
# Hugging Face weights out
# -------------------------------------------------------------------------------------------------


def export_hf_weights(model: Any, converter: Converter, groups: Groups) -> Iterator[tuple[str, torch.Tensor]]:
    """The model's weights in Hugging Face names, each once, as full (unsharded) CPU tensors.

    A collective over the tensor-, expert- and pipeline-parallel groups: every rank must iterate
    it to the end, and every rank receives every tensor. The tied output layer and the vocabulary
    padding are left out. Order: pipeline stages in order, parameters in model order; a routed
    expert's parameter (``local_experts.{i}``) yields expert-parallel rank 0's expert first, then
    rank 1's, and so on (experts ``i``, ``E/e + i``, ...).
    """
    model = unwrapped(model)
    offset = layer_offset(model)
    local: list[tuple[str, Rule, torch.Tensor]] = []
    for name, param in model.named_parameters():
        rule = converter.rule(name, offset, groups.ep_rank)
        if rule.exported:
            local.append((name, rule, param))

    def merged(name: str, rule: Rule, param: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        if rule.split == "replicated":
            shards = [param.detach()] * converter.parts(rule)
        elif rule.expert:
            shards = all_gather(param.detach(), groups.etp_group, groups.etp_size)
        else:
            shards = all_gather(param.detach(), groups.tp_group, groups.tp_size)
        tensors = [tensor for _, tensor in converter.merge(rule, shards)]
        if not rule.expert or groups.ep_size == 1:
            return [(hf_name, tensor.to("cpu", copy=True).contiguous())
                    for hf_name, tensor in zip(rule.hf_names, tensors, strict=True)]
        # every expert-parallel rank holds other experts under the same parameter name
        per_rank = [all_gather(tensor, groups.ep_group, groups.ep_size) for tensor in tensors]
        return [(hf_name, per_rank[position][rank].to("cpu", copy=True).contiguous())
                for rank in range(groups.ep_size)
                for position, hf_name in enumerate(converter.rule(name, offset, rank).hf_names)]

    if groups.pp_size == 1:
        for entry in local:
            yield from merged(*entry)
        return

    # pipeline stages take turns: the owner gathers and converts, then broadcasts over its pipeline
    catalog: list[Any] = [None] * groups.pp_size
    dist.all_gather_object(catalog, [(*_merged_shapes(converter, name, offset, groups.ep_size, rule, param),
                                      str(param.dtype).removeprefix("torch."))
                                     for name, rule, param in local], group=groups.pp_group)
    device = next(iter(model.parameters())).device
    for stage, entries in enumerate(catalog):
        source = dist.get_global_rank(groups.pp_group, stage)
        for position, (hf_names, shape, dtype) in enumerate(entries):
            if stage == groups.pp_rank:
                tensors = merged(*local[position])
            else:
                tensors = [(hf_name, torch.empty(size, dtype=DTYPES.get(dtype, torch.float32)))
                           for hf_name, size in zip(hf_names, shape, strict=True)]
            for hf_name, tensor in tensors:
                moved = tensor.to(device)
                dist.broadcast(moved, src=source, group=groups.pp_group)
                yield hf_name, moved.to("cpu").contiguous() if moved.device.type != "cpu" else moved


def _merged_shapes(converter: Converter, name: str, offset: int, ep_size: int, rule: Rule,
                   param: torch.Tensor) -> tuple[list[str], list[tuple[int, ...]]]:
    """Names and shapes of the Hugging Face tensors that ``export_hf_weights`` yields for a
    parameter, in its order (without communicating)."""
    fake = [torch.empty(param.shape, dtype=torch.float32, device="meta") for _ in range(converter.parts(rule))]
    shapes = [tuple(tensor.shape) for _, tensor in converter.merge(rule, fake)]
    if not rule.expert or ep_size == 1:
        return list(rule.hf_names), shapes
    names = [hf_name for rank in range(ep_size) for hf_name in converter.rule(name, offset, rank).hf_names]
    return names, shapes * ep_size

