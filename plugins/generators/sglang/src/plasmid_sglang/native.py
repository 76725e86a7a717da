"""SGLang's ``ServerArgs`` as ``--sglang-<field>`` options, generated from the installed version.

In sglang 0.5.x, ``ServerArgs`` is assembled at import time from namespace classes
(``sglang/srt/arg_groups/fields/*.py``: ``Model``, ``Memory``, ``Serving``, ...) listed in
``_INPUT_NAMESPACES`` of ``sglang/srt/server_args.py``; each field is annotated
``A[T, "help"]`` or ``A[T, Arg(help=..., no_cli=..., type_parser=...)]``
(``A`` is ``typing.Annotated``). Importing ``sglang.srt.server_args`` takes seconds and pulls in
torch, which ``plasmid_addoption`` (run by every ``plasmid`` command) must not do; so this module
reads that list and those classes from the source files with :mod:`plasmid_serving.native_options`.

Every field whose name does not start with ``_`` becomes an option:

- a scalar (``bool``, ``int``, ``float``, ``str``, a ``Literal``, ``Optional`` of those) without
  a ``type_parser`` gets that type (``--sglang-dtype float32``, ``--sglang-sleep-on-idle``,
  ``--sglang-disable-radix-cache false``);
- anything else (lists, dicts, values with SGLang's own parser) is ``text``: the string is parsed
  by SGLang's own command-line parser inside the server process
  (``--sglang-lora-paths "a=/x b=/y"`` becomes ``--lora-paths a=/x b=/y``).

Values default to ``None``: "not given". Fields plasmid sets itself when not given are listed in
:data:`PLASMID_DEFAULTS` (see :mod:`plasmid_sglang.server` for the values); ``model_path`` is
``--model`` and is not an option.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

from plasmid_serving.native_options import (
    NativeField,
    SourceField,
    class_fields,
    first_sentence,
    imported_file,
    name_of,
    native_fields_of,
    package_directory,
    parse_module,
    scalar_kind,
)

PREFIX = "sglang-"
SERVER_ARGS = "srt/server_args.py"
NAMESPACE_LIST = "_INPUT_NAMESPACES"

#: Fields that are not ``--sglang-*`` options, with where the value comes from.
NOT_NATIVE = {"model_path": "--model"}

#: Fields plasmid fills in when not given, and why (values in :func:`plasmid_sglang.server.server_fields`).
PLASMID_DEFAULTS = {
    "host": "127.0.0.1: servers are reached by this process only",
    "port": "a free port per server (given: the first port; each server of this process takes the next)",
    "random_seed": "--seed plus the server's number in this process",
    "device": "cuda when torch sees a GPU, else cpu",
    "attention_backend": "torch_native on cpu",
    "sampling_backend": "pytorch on cpu",
    "dtype": "the checkpoint's dtype (SGLang's auto serves float32 checkpoints in float16)",
    "skip_tokenizer_init": "true: plasmid sends and reads token ids",
    "sleep_on_idle": "true on cpu (an idle scheduler otherwise spins a core)",
    "max_total_tokens": "16384 on cpu (SGLang sizes the KV cache from free host memory otherwise)",
    "weight_version": "0",
    "enable_memory_saver": "true with --placement colocate on a GPU",
    "enable_weights_cpu_backup": "true with --placement colocate on a GPU",
}


def sglang_source_root() -> Path | None:
    """The installed ``sglang/`` package directory (found without importing it), or ``None``."""
    return package_directory("sglang", marker=SERVER_ARGS)


@functools.lru_cache(maxsize=4)
def native_fields(root: Path | None = None) -> tuple[NativeField, ...]:
    """Every ``ServerArgs`` field of the SGLang at ``root`` (default: the installed one) as an
    option, in namespace order; empty when SGLang is not installed."""
    root = root or sglang_source_root()
    if root is None:
        return ()
    server_args = root / SERVER_ARGS
    tree = parse_module(server_args)
    if tree is None:
        return ()
    return native_fields_of(_namespace_fields(root, server_args, tree), PREFIX, skip=NOT_NATIVE,
                            option_type=_option_type)


def _namespace_fields(root: Path, server_args: Path, tree: ast.Module) -> Iterator[tuple[str, SourceField]]:
    """``(namespace, field)`` of every namespace class listed in ``server_args``, in order."""
    for namespace in _namespace_names(tree):
        path = imported_file(server_args, tree, namespace, root=root, package="sglang")
        if path is not None:
            for source in class_fields(path, namespace, root=root, package="sglang"):
                yield namespace, source


def _namespace_names(tree: ast.Module) -> list[str]:
    """The class names in ``_INPUT_NAMESPACES = [Model, ...]``."""
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == NAMESPACE_LIST for t in targets) \
                and isinstance(node.value, ast.List | ast.Tuple):
            return [item.id for item in node.value.elts if isinstance(item, ast.Name)]
    return []


def _option_type(source: SourceField) -> tuple[str, tuple[str, ...] | None, str]:
    """``(kind, choices, doc)`` of a field annotated ``A[T, "help" | Arg(...)]`` (or plainly)."""
    annotation = source.annotation
    inner, metadata = annotation, []
    if isinstance(annotation, ast.Subscript) and name_of(annotation.value) in ("A", "Annotated") \
            and isinstance(annotation.slice, ast.Tuple) and annotation.slice.elts:
        inner, *metadata = annotation.slice.elts
    doc, parsed_by_sglang = "", False
    for item in metadata:
        if isinstance(item, ast.Constant) and isinstance(item.value, str):
            doc = item.value
        elif isinstance(item, ast.Call) and name_of(item.func) == "Arg":
            for keyword in item.keywords:
                if keyword.arg == "help" and isinstance(keyword.value, ast.Constant):
                    doc = str(keyword.value.value)
                elif keyword.arg in ("type_parser", "action", "nargs"):
                    parsed_by_sglang = True
    typed = None if parsed_by_sglang else scalar_kind(inner)
    kind, choices = typed if typed is not None else ("text", None)
    return kind, choices, first_sentence(doc)

