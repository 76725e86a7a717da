"""megatron-core's own settings as ``--megatron-<field>`` options, generated from the installed version.

Every scalar field (``bool``, ``int``, ``float``, ``str``, a ``Literal`` of strings, ``torch.dtype``,
or ``Optional`` of those) of ``TransformerConfig`` (with its base ``ModelParallelConfig``),
``OptimizerConfig`` and ``DistributedDataParallelConfig`` becomes an option
``--megatron-<field-with-dashes>`` (``config.option.megatron_<field>``); a field that two classes share
(``bf16``, ``use_distributed_optimizer``) is one option that sets both.

**Why the fields are read from source, not imported.** Options are declared in ``plasmid_addoption``,
which runs for every ``plasmid train`` (whatever the trainer) and for ``plasmid plugins show``;
``import megatron.core`` takes seconds and imports torch, which the kernel promises these commands
never do. So this module finds the installed megatron-core's source files (``importlib.util.find_spec``
of the namespace package ``megatron`` imports nothing) and reads the dataclass fields with :mod:`ast`:
names, annotations, defaults as written, and the docstring under each field. That is the installed
version's exact field list, in milliseconds, with no import. When the trainer is built (megatron is
imported then anyway) the values given are checked against the real ``dataclasses.fields``.

Fields that are not options, and why (:data:`NOT_NATIVE`): the model's shape comes from ``--model``'s
``config.json``; the parallel sizes have their own flags; the optimizer hyper-parameters that every
trainer shares are the kernel's ``--lr``, ``--min-lr``, ``--weight-decay``, ``--adam-beta1/2`` and
``--clip-grad``; and a few are set by the trainer because its loss handling depends on them.

Values default to ``None``: "not given, use megatron's default (or the trainer's choice, see
:mod:`plasmid_megatron.model`)". A boolean option alone means true: ``--megatron-sequence-parallel``;
``--megatron-masked-softmax-fusion false`` turns one off.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
                     "gated_linear_unit", "qk_layernorm", "activation_func"), "--model's config.json"),
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

DTYPE_CHOICES = ("float32", "bfloat16", "float16")
PREFIX = "megatron_"


@dataclass(frozen=True)
class NativeField:
    """One field of megatron-core's config dataclasses, as read from its source.

    :ivar name: the field name (``sequence_parallel``).
    :ivar owners: the classes that have it (``("TransformerConfig",)``).
    :ivar kind: ``bool``, ``int``, ``float``, ``str`` or ``dtype``.
    :ivar choices: allowed values (``Literal`` fields, dtypes), or ``None``.
    :ivar default: the default as written in the source (``"False"``, ``"torch.float32"``).
    :ivar doc: the first sentence of the field's docstring.
    """

    name: str
    owners: tuple[str, ...]
    kind: str
    choices: tuple[str, ...] | None
    default: str
    doc: str

    @property
    def flag(self) -> str:
        return "--megatron-" + self.name.replace("_", "-")

    @property
    def dest(self) -> str:
        return PREFIX + self.name


def parse_bool(text: str) -> bool:
    """``true/false``, ``1/0``, ``yes/no``, ``on/off`` (any case)."""
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


parse_bool.__name__ = "bool"   # argparse names the type in its error message


def megatron_source_root() -> Path | None:
    """The installed ``megatron/`` package directory (found without importing it), or ``None``."""
    try:
        spec = importlib.util.find_spec("megatron")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    for location in spec.submodule_search_locations or []:
        if (Path(location) / "core").is_dir():
            return Path(location)
    return None


@functools.lru_cache(maxsize=4)
def native_fields(root: Path | None = None) -> tuple[NativeField, ...]:
    """Every pass-through field of :data:`CONFIG_CLASSES` in the megatron-core at ``root``
    (default: the installed one), in declaration order; empty when megatron-core is not installed."""
    root = root or megatron_source_root()
    if root is None:
        return ()
    merged: dict[str, NativeField] = {}
    for class_name, relative in CONFIG_CLASSES.items():
        for field in _class_fields(root, root / relative, class_name):
            if field.name in NOT_NATIVE:
                continue
            known = merged.get(field.name)
            if known is None:
                merged[field.name] = field
            elif known.kind == field.kind:
                merged[field.name] = NativeField(field.name, known.owners + field.owners, known.kind, known.choices,
                                                 known.default, known.doc)
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


# -------------------------------------------------------------------------------------------------
# reading dataclasses from source
# -------------------------------------------------------------------------------------------------


def _class_fields(root: Path, path: Path, class_name: str, _depth: int = 0) -> list[NativeField]:
    """Fields of dataclass ``class_name`` in ``path``, its bases' first (resolved through the
    module's ``from ... import`` lines, within megatron)."""
    if _depth > 5 or not path.is_file():
        return []
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    node = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name), None)
    if node is None:
        return []
    fields: dict[str, NativeField] = {}
    for base in node.bases:
        if isinstance(base, ast.Name):
            base_path = _imported_from(root, path, tree, base.id)
            if base_path is not None:
                for field in _class_fields(root, base_path, base.id, _depth + 1):
                    fields[field.name] = NativeField(field.name, (class_name,), field.kind, field.choices,
                                                     field.default, field.doc)
    body = node.body
    for position, statement in enumerate(body):
        if not (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)):
            continue
        name = statement.target.id
        if name.startswith("_"):
            continue
        typed = _scalar_type(statement.annotation)
        default = _default_text(statement.value)
        if typed is None or default is None:
            fields.pop(name, None)
            continue
        kind, choices = typed
        doc = ""
        following = body[position + 1] if position + 1 < len(body) else None
        if isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant) \
                and isinstance(following.value.value, str):
            doc = _first_sentence(following.value.value)
        fields[name] = NativeField(name, (class_name,), kind, choices, default, doc)
    return list(fields.values())


def _imported_from(root: Path, path: Path, tree: ast.Module, name: str) -> Path | None:
    """The file that ``from X import name`` in ``tree`` (the module at ``path``) refers to."""
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and any(alias.name == name for alias in node.names):
            if node.level:
                base = path.parent
                for _ in range(node.level - 1):
                    base = base.parent
                parts = (node.module or "").split(".") if node.module else []
            else:
                module = node.module or ""
                if not module.startswith("megatron."):
                    return None
                base, parts = root, module.split(".")[1:]
            candidate = base.joinpath(*parts)
            if candidate.with_suffix(".py").is_file():
                return candidate.with_suffix(".py")
            if (candidate / "__init__.py").is_file():
                return candidate / "__init__.py"
    return None


def _scalar_type(annotation: ast.expr) -> tuple[str, tuple[str, ...] | None] | None:
    """``(kind, choices)`` of a scalar annotation, or ``None`` for anything else."""
    annotation = _strip_optional(annotation)
    if isinstance(annotation, ast.Name) and annotation.id in ("bool", "int", "float", "str"):
        return annotation.id, None
    if isinstance(annotation, ast.Attribute) and ast.unparse(annotation) == "torch.dtype":
        return "dtype", DTYPE_CHOICES
    if isinstance(annotation, ast.Subscript) and _name_of(annotation.value) == "Literal":
        items = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
        if all(isinstance(item, ast.Constant) and isinstance(item.value, str) for item in items):
            return "str", tuple(item.value for item in items)
    return None


def _strip_optional(annotation: ast.expr) -> ast.expr:
    if isinstance(annotation, ast.Subscript) and _name_of(annotation.value) == "Optional":
        return annotation.slice
    if isinstance(annotation, ast.Subscript) and _name_of(annotation.value) == "Union":
        items = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
        rest = [item for item in items if not (isinstance(item, ast.Constant) and item.value is None)]
        return rest[0] if len(rest) == 1 else annotation
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        sides = [annotation.left, annotation.right]
        rest = [side for side in sides if not (isinstance(side, ast.Constant) and side.value is None)]
        return rest[0] if len(rest) == 1 else annotation
    return annotation


def _name_of(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _default_text(value: ast.expr | None) -> str | None:
    """The default as source text; ``None`` for a field without a plain default
    (required, or ``field(default_factory=...)``)."""
    if value is None:
        return None
    if isinstance(value, ast.Call) and _name_of(value.func) == "field":
        for keyword in value.keywords:
            if keyword.arg == "default":
                return ast.unparse(keyword.value)
        return None
    return ast.unparse(value)


def _first_sentence(doc: str, limit: int = 110) -> str:
    text = " ".join(doc.split())
    cut = text.find(". ")
    if cut != -1:
        text = text[: cut + 1]
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."
