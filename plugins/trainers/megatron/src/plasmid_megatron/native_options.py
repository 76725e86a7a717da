"""megatron-core's own settings as ``--megatron-<field>`` options, generated from the installed version.

Every scalar field (``bool``, ``int``, ``float``, ``str``, a ``Literal`` of strings, ``torch.dtype``,
or ``Optional`` of those) of ``TransformerConfig`` (with its base ``ModelParallelConfig``),
``OptimizerConfig`` and ``DistributedDataParallelConfig`` becomes an option
``--megatron-<field-with-dashes>`` (``config.option.megatron_<field>``); a field that two classes share
(``bf16``, ``use_distributed_optimizer``) is one option that sets both.

**Why the fields are read from source, not imported.** Options are declared in ``plasmid_addoption``,
which runs for every ``plasmid train`` (whatever the trainer) and for ``plasmid plugins show``;
``import megatron.core`` takes seconds and imports torch, which the kernel promises these commands
never do. So the fields are read from the installed megatron-core's source files with the kernel's
:mod:`plasmid_serving.native_options` (``importlib.util.find_spec`` of the namespace package ``megatron``
imports nothing; :mod:`ast` gives names, annotations, defaults as written and each field's
docstring). That is the installed version's exact field list, in milliseconds, with no import.
When the trainer is built (megatron is imported then anyway) the values given are checked against
the real ``dataclasses.fields``.

Fields that are not options, and why (:data:`NOT_NATIVE`): the model's shape comes from ``--model``'s
``config.json``; the parallel sizes have their own flags; the optimizer hyper-parameters that every
trainer shares are :class:`plasmid_torch.trainer_options.TrainerOptions`' ``--lr``, ``--min-lr``,
``--weight-decay``, ``--adam-beta1/2`` and ``--clip-grad``; and a few are set by the trainer because
its loss handling depends on them.

Values default to ``None``: "not given, use megatron's default (or the trainer's choice, see
:mod:`plasmid_megatron.model`)". A boolean option alone means true: ``--megatron-sequence-parallel``;
``--megatron-masked-softmax-fusion false`` turns one off.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from plasmid_serving.native_options import (
    DTYPE_CHOICES,
    NativeField,
    class_fields,
    package_directory,
    parse_bool,
    scalar_kind,
)

#: The config dataclasses whose fields pass through: class name -> its file under ``megatron/``.
CONFIG_CLASSES = {
    "TransformerConfig": "core/transformer/transformer_config.py",
    "OptimizerConfig": "core/optimizer/optimizer_config.py",
    "DistributedDataParallelConfig": "core/distributed/distributed_data_parallel_config.py",
}

#: Fields that are not ``--megatron-*`` options, with where their value comes from instead.
NOT_NATIVE = {
    **dict.fromkeys(("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
                     "ffn_hidden_size", "normalization", "layernorm_epsilon", "add_bias_linear", "add_qkv_bias",
                     "gated_linear_unit", "qk_layernorm", "activation_func", "num_moe_experts", "moe_ffn_hidden_size",
                     "moe_router_topk", "moe_router_pre_softmax", "moe_shared_expert_intermediate_size",
                     "moe_shared_expert_gate", "moe_layer_freq"), "--model's config.json"),
    "tensor_model_parallel_size": "--tensor-model-parallel-size",
    "pipeline_model_parallel_size": "--pipeline-model-parallel-size",
    "context_parallel_size": "--context-parallel-size",
    "expert_model_parallel_size": "--expert-model-parallel-size",
    "virtual_pipeline_model_parallel_size": "not supported yet (one model chunk per stage)",
    "lr": "--lr",
    "min_lr": "--min-lr",
    "weight_decay": "--weight-decay",
    "adam_beta1": "--adam-beta1",
    "adam_beta2": "--adam-beta2",
    "clip_grad": "--clip-grad",
    "calculate_per_token_loss": "the trainer (losses are normalised by the step's totals)",
    "variable_seq_lengths": "the trainer (on with pipeline parallelism: micro-batches differ in length)",
    "params_dtype": "--megatron-bf16 / --megatron-fp16",
    "pipeline_dtype": "--megatron-bf16 / --megatron-fp16",
}

PREFIX = "megatron-"

__all__ = ["CONFIG_CLASSES", "DTYPE_CHOICES", "NOT_NATIVE", "NativeField", "check_against", "megatron_source_root",
           "native_fields", "native_values", "parse_bool"]


def megatron_source_root() -> Path | None:
    """The installed ``megatron/`` package directory (found without importing it), or ``None``."""
    return package_directory("megatron", marker="core")


@functools.lru_cache(maxsize=4)
def native_fields(root: Path | None = None) -> tuple[NativeField, ...]:
    """Every pass-through field of :data:`CONFIG_CLASSES` in the megatron-core at ``root``
    (default: the installed one), in declaration order; empty when megatron-core is not installed.
    Scalar fields with a plain default only (see :func:`plasmid_serving.native_options.scalar_kind`)."""
    root = root or megatron_source_root()
    if root is None:
        return ()
    merged: dict[str, NativeField] = {}
    for class_name, relative in CONFIG_CLASSES.items():
        for source in class_fields(root / relative, class_name, root=root, package="megatron"):
            typed = scalar_kind(source.annotation)
            if source.name in NOT_NATIVE or typed is None or source.default is None:
                continue
            kind, choices = typed
            known = merged.get(source.name)
            if known is None:
                merged[source.name] = NativeField(source.name, (class_name,), kind, choices, source.default,
                                                  source.doc, PREFIX)
            elif known.kind == kind:
                merged[source.name] = NativeField(source.name, known.owners + (class_name,), known.kind,
                                                  known.choices, known.default, known.doc, PREFIX)
            # a name shared with a different type stays with the first class (never seen in 0.16)
    return tuple(merged.values())


def native_values(option: Any, fields: Iterable[NativeField] | None = None) -> dict[str, dict[str, Any]]:
    """The ``--megatron-*`` values given on the command line, per config class:
    ``{"TransformerConfig": {"sequence_parallel": True}, ...}``. Dtypes stay names (``"bfloat16"``)."""
    given: dict[str, dict[str, Any]] = {name: {} for name in CONFIG_CLASSES}
    for field in native_fields() if fields is None else fields:
        value = getattr(option, field.dest, None)
        if value is None:
            continue
        for owner in field.owners:
            given[owner][field.name] = value
    return given


def check_against(cls: type, values: dict[str, Any]) -> None:
    """Raise ``ValueError`` naming the option when a value is not a field of dataclass ``cls``
    (the imported one, which must agree with the source that the options were generated from)."""
    import dataclasses

    names = {field.name for field in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        flags = ", ".join("--megatron-" + name.replace("_", "-") for name in unknown)
        raise ValueError(f"{flags}: not a field of the imported {cls.__module__}.{cls.__name__}; the options were "
                         f"generated from a different megatron-core source than the one imported")
