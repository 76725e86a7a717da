"""A framework's own settings as plasmid options, read from its installed source without importing it.

Plugins that wrap a large framework (megatron-core's config dataclasses, SGLang's ``ServerArgs``)
pass that framework's settings straight through as ``--<prefix>-<field>`` options. Those options
must be declared in ``plasmid_addoption``, which runs for every ``plasmid`` command, and the
kernel promises that ``plasmid plugins`` and building a configuration import no heavy framework.
So the fields are read from the installed package's *source files* with :mod:`ast`: the package
is located with ``importlib.util.find_spec`` of its top-level name (which imports nothing), each
class body is parsed, and every annotated field gives its name, annotation, default as written
and the docstring under it. That is the installed version's exact field list, in milliseconds.

What this module provides, from raw to ready:

- :func:`package_directory`: where an installed top-level package lives, without importing it;
- :func:`class_fields`: the annotated fields of a class in a source file, its base classes'
  first (bases are followed through the module's ``from ... import`` lines, within the package);
- :func:`imported_file`: the file that a ``from X import Name`` line of a module refers to;
- :func:`scalar_kind`: the option type of an annotation (``bool``, ``int``, ``float``, ``str``,
  a ``Literal`` of strings, ``torch.dtype``, ``Optional`` of those), or ``None``;
- :func:`native_field` and :func:`native_fields_of`: the options of source fields (one per name,
  the first class to have it naming it);
- :class:`NativeField`, :func:`add_options` and :func:`given_values`: the options themselves,
  declared with argparse types, and the values a user gave.

A plugin decides which classes and fields pass through and what a field's annotation means
(its own wrappers such as ``Annotated``); everything generic is here.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Names of ``torch.dtype`` fields' values (options take the name).
DTYPE_CHOICES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class SourceField:
    """One annotated field of a class, as written in its source.

    :ivar name: the field name.
    :ivar owner: the class it was read from (a base class's fields carry the base's name).
    :ivar annotation: the annotation's syntax tree.
    :ivar default: the default as source text (``"False"``, ``"torch.float32"``), or ``None`` when
        the field has none (required, or ``field(default_factory=...)``).
    :ivar doc: the first sentence of the string literal right under the field, or ``""``.
    """

    name: str
    owner: str
    annotation: ast.expr
    default: str | None
    doc: str


@dataclass(frozen=True)
class NativeField:
    """One pass-through option: a field of the framework's configuration.

    :ivar name: the field name (``sequence_parallel``).
    :ivar owners: the classes that have it (a field two classes share is one option).
    :ivar kind: ``bool``, ``int``, ``float``, ``str``, ``dtype``, or ``text`` (a value the
        framework parses itself: lists, JSON, anything non-scalar; the option keeps the string).
    :ivar choices: allowed values, or ``None``.
    :ivar default: the framework's default as written in its source (shown in ``--help``).
    :ivar doc: one sentence about it (from the source), for ``--help``.
    :ivar prefix: the option prefix with its trailing dash (``"megatron-"``).
    """

    name: str
    owners: tuple[str, ...]
    kind: str
    choices: tuple[str, ...] | None
    default: str
    doc: str
    prefix: str

    @property
    def flag(self) -> str:
        """``--<prefix><field-with-dashes>``."""
        return "--" + self.prefix + self.name.replace("_", "-")

    @property
    def dest(self) -> str:
        """The attribute of ``config.option`` holding the value (``megatron_sequence_parallel``)."""
        return self.prefix.replace("-", "_") + self.name


def package_directory(package: str, marker: str | None = None) -> Path | None:
    """The directory of installed top-level package ``package``, found without importing it, or
    ``None`` when it is not installed. ``marker``: a path that must exist under it (a namespace
    package spread over several directories gives the one that holds it)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        if marker is None or (Path(location) / marker).exists():
            return Path(location)
    return None


def parse_module(path: Path) -> ast.Module | None:
    """The syntax tree of the Python file at ``path``, or ``None`` when it does not exist."""
    if not path.is_file():
        return None
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def class_fields(path: Path, class_name: str, *, root: Path, package: str, _depth: int = 0) -> list[SourceField]:
    """The annotated fields of class ``class_name`` defined in file ``path``, in declaration
    order, its base classes' fields first (a redefinition replaces the base's field).

    :param root: the package's directory (:func:`package_directory`), to resolve absolute imports.
    :param package: the package's import name (``"megatron"``), the prefix of absolute imports
        that are followed; bases imported from elsewhere are not read.
    Fields whose names start with ``_`` are left out. An empty list when the file or class is missing.
    """
    tree = parse_module(path)
    if tree is None or _depth > 8:
        return []
    node = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name), None)
    if node is None:
        return []
    fields: dict[str, SourceField] = {}
    for base in node.bases:
        if isinstance(base, ast.Name):
            base_path = imported_file(path, tree, base.id, root=root, package=package)
            if base_path is None and any(isinstance(n, ast.ClassDef) and n.name == base.id for n in tree.body):
                base_path = path
            if base_path is not None:
                for field in class_fields(base_path, base.id, root=root, package=package, _depth=_depth + 1):
                    fields[field.name] = SourceField(field.name, class_name, field.annotation, field.default,
                                                     field.doc)
    body = node.body
    for position, statement in enumerate(body):
        if not (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)):
            continue
        name = statement.target.id
        if name.startswith("_"):
            continue
        doc = ""
        following = body[position + 1] if position + 1 < len(body) else None
        if isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant) \
                and isinstance(following.value.value, str):
            doc = first_sentence(following.value.value)
        fields[name] = SourceField(name, class_name, statement.annotation, default_text(statement.value), doc)
    return list(fields.values())


def imported_file(path: Path, tree: ast.Module, name: str, *, root: Path, package: str) -> Path | None:
    """The file that a ``from X import name`` line in ``tree`` (the module at ``path``) refers
    to: relative imports, or absolute ones under ``package`` (resolved from ``root``)."""
    for node in tree.body:
        if not (isinstance(node, ast.ImportFrom) and any(alias.name == name for alias in node.names)):
            continue
        if node.level:
            base = path.parent
            for _ in range(node.level - 1):
                base = base.parent
            parts = node.module.split(".") if node.module else []
        else:
            module = node.module or ""
            if not module.startswith(package + "."):
                return None
            base, parts = root, module.split(".")[1:]
        candidate = base.joinpath(*parts)
        if candidate.with_suffix(".py").is_file():
            return candidate.with_suffix(".py")
        if (candidate / "__init__.py").is_file():
            return candidate / "__init__.py"
    return None


def scalar_kind(annotation: ast.expr) -> tuple[str, tuple[str, ...] | None] | None:
    """``(kind, choices)`` of a scalar annotation (see :class:`NativeField`), or ``None``.
    A field that takes one value or a list of them (``Union[float, List[float]]``) is the scalar:
    an option gives one value."""
    annotation = one_or_list_of(strip_optional(annotation))
    if isinstance(annotation, ast.Name) and annotation.id in ("bool", "int", "float", "str"):
        return annotation.id, None
    if isinstance(annotation, ast.Attribute) and ast.unparse(annotation) == "torch.dtype":
        return "dtype", DTYPE_CHOICES
    if isinstance(annotation, ast.Subscript) and name_of(annotation.value) == "Literal":
        items = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
        choices = [item.value for item in items if isinstance(item, ast.Constant) and isinstance(item.value, str)]
        if items and len(choices) == len(items):
            return "str", tuple(choices)
    return None


#: ``(kind, choices, doc)`` of an option, from a source field (:func:`native_field`'s ``option_type``)
OptionType = Callable[[SourceField], tuple[str, tuple[str, ...] | None, str]]


def plain_option_type(source: SourceField) -> tuple[str, tuple[str, ...] | None, str]:
    """:func:`scalar_kind` of the field's annotation (``text`` when not a scalar) and its docstring."""
    typed = scalar_kind(source.annotation)
    kind, choices = typed if typed is not None else ("text", None)
    return kind, choices, source.doc


def native_field(source: SourceField, owner: str, prefix: str,
                 option_type: OptionType = plain_option_type) -> NativeField:
    """The option of field ``source`` of class ``owner`` (default ``"required"`` when the source
    gives none); ``option_type`` reads its kind, choices and help (the framework's annotations)."""
    kind, choices, doc = option_type(source)
    return NativeField(source.name, (owner,), kind, choices, source.default if source.default is not None
                       else "required", doc, prefix)


def native_fields_of(sources: Iterable[tuple[str, SourceField]], prefix: str, *, skip: Container[str] = (),
                     option_type: OptionType = plain_option_type) -> tuple[NativeField, ...]:
    """One option per field name of ``sources`` (``(owner class, field)`` pairs, in order; the
    first owner of a name gives its option), leaving out the names in ``skip``."""
    fields: dict[str, NativeField] = {}
    for owner, source in sources:
        if source.name not in skip and source.name not in fields:
            fields[source.name] = native_field(source, owner, prefix, option_type)
    return tuple(fields.values())


def strip_optional(annotation: ast.expr) -> ast.expr:
    """``X`` for ``Optional[X]``, ``Union[X, None]`` and ``X | None``; else the annotation."""
    if isinstance(annotation, ast.Subscript) and name_of(annotation.value) == "Optional":
        return annotation.slice
    if isinstance(annotation, ast.Subscript) and name_of(annotation.value) == "Union":
        items = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
        rest = [item for item in items if not _is_none(item)]
        return rest[0] if len(rest) == 1 else annotation
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        rest = [side for side in (annotation.left, annotation.right) if not _is_none(side)]
        return rest[0] if len(rest) == 1 else annotation
    return annotation


def one_or_list_of(annotation: ast.expr) -> ast.expr:
    """``X`` for ``Union[X, List[X]]`` and ``X | list[X]`` (either order); else the annotation."""
    if isinstance(annotation, ast.Subscript) and name_of(annotation.value) == "Union" \
            and isinstance(annotation.slice, ast.Tuple):
        items = list(annotation.slice.elts)
    elif isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        items = [annotation.left, annotation.right]
    else:
        return annotation
    if len(items) == 2:
        for one, other in (items, items[::-1]):
            if isinstance(other, ast.Subscript) and name_of(other.value) in ("List", "list") \
                    and ast.dump(other.slice) == ast.dump(one):
                return one
    return annotation


def name_of(node: ast.expr) -> str:
    """``Literal`` for ``Literal`` and ``typing.Literal``; ``""`` for other nodes."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def default_text(value: ast.expr | None) -> str | None:
    """A field's default as source text; ``None`` without a plain default."""
    if value is None:
        return None
    if isinstance(value, ast.Call) and name_of(value.func) == "field":
        for keyword in value.keywords:
            if keyword.arg == "default":
                return ast.unparse(keyword.value)
        return None
    return ast.unparse(value)


def first_sentence(doc: str, limit: int = 110) -> str:
    """The first sentence of ``doc`` on one line, at most ``limit`` characters."""
    text = " ".join(doc.split())
    cut = text.find(". ")
    if cut != -1:
        text = text[: cut + 1]
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def parse_bool(text: str) -> bool:
    """``true/false``, ``1/0``, ``yes/no``, ``on/off`` (any case)."""
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


parse_bool.__name__ = "bool"   # argparse names the type in its error message


class Switch(argparse.Action):
    """A boolean native option: ``--x-flag`` alone or ``--x-flag true`` sets true, ``--x-flag false``
    false, and ``--no-x-flag`` (its second flag, which takes no value) false, as every plasmid
    switch has a ``--no-`` form. Declared with ``const=None``: argparse passes ``None`` for a flag
    given without a value."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if option_string is not None and option_string.startswith("--no-"):
            if values is not None:
                parser.error(f"argument {option_string}: takes no value (got {values!r}); "
                             f"use {self.option_strings[0]} {str(values).lower()} instead")
            setattr(namespace, self.dest, False)
            return
        setattr(namespace, self.dest, True if values is None else values)


def add_options(group: Any, fields: Iterable[NativeField]) -> None:
    """Declare one option per field in ``group`` (a plasmid ``OptionGroup``), defaulting to
    ``None`` ("not given: the framework's default"). A boolean option alone means true
    (``--x-flag``; ``--x-flag false`` or ``--no-x-flag`` turns it off, :class:`Switch`); ``text``
    options keep the string given."""
    for field in fields:
        kwargs: dict[str, Any] = {"dest": field.dest, "default": None, "metavar": field.kind.upper()}
        flags = [field.flag]
        if field.kind == "bool":
            kwargs.update(type=parse_bool, nargs="?", const=None, metavar="BOOL", action=Switch)
            flags.append("--no-" + field.flag[2:])
        elif field.kind in ("int", "float"):
            kwargs["type"] = int if field.kind == "int" else float
        if field.choices:
            kwargs.update(choices=list(field.choices), metavar=None)
        owners = "/".join(field.owners)
        text = f"{owners + '.' if owners else ''}{field.name} (default {field.default}). {field.doc}".rstrip()
        group.addoption(*flags, help=text.replace("%", "%%"), **kwargs)


def given_values(option: Any, fields: Iterable[NativeField]) -> dict[str, Any]:
    """``{field name: value}`` of the fields whose option was given (not ``None``)."""
    return {field.name: value for field in fields if (value := getattr(option, field.dest, None)) is not None}


def _is_none(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is None
