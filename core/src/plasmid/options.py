"""Typed options, declared once: a frozen dataclass per provider is its flags, its ``--help``, its
checks and the typed value it reads.

A provider (or a family's shared library) declares its settings as a subclass of
:class:`Options`; every field is a flag ``--<field-with-dashes>`` whose type comes from the
annotation and whose default, help text and range come from :func:`option`::

    from typing import Literal
    from plasmid.options import Options, option

    class SyncOptions(Options, group="sync", description="weight syncs of plasmid-sync"):
        sync_dir: str | None = option(None, "where disk and delta write weight versions")
        sync_keep_versions: int = option(2, "versions kept on disk, newest first", min=1)
        broadcast_backend: Literal["auto", "gloo", "nccl"] = option("auto", "torch.distributed backend")

The plugin's ``plasmid_addoption`` hook declares it with ``parser.add_options(SyncOptions)``
(declaring the same class from two plugins is allowed: a family's shared options are declared by
each plugin that reads them; two *different* declarations of one flag are an error). The
provider reads ``SyncOptions.of(config)``: the values of the run, converted and checked, as a
frozen instance; nothing restates a default where it is read.

Annotations understood: ``bool`` (a switch, and ``--no-<flag>`` to turn it off: a flag can undo a config file),
``int``, ``float``, ``str``, ``pathlib.Path``, ``Literal[...]`` of strings (choices),
``tuple[str, ...]`` (a repeatable flag, in the order given), and ``X | None`` of these.

Checks run once at start-up, after the defaults hooks and before ``plasmid_configure``; a failing
check is a :class:`plasmid.errors.UsageError` of one line naming the flag. Cross-field rules go in
:meth:`Options.check`; values derived from others are properties of the class.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar, dataclass_transform

from plasmid.errors import UsageError


class HoldsOptions(typing.Protocol):
    """What :meth:`Options.of` reads: a :class:`plasmid.config.Config`, whose ``option`` namespace
    holds every option's raw value."""

    option: argparse.Namespace


#: Key of a dataclass field's metadata that holds its :class:`OptionSpec`.
SPEC_KEY = "plasmid.option"

OptionsT = TypeVar("OptionsT", bound="Options")


@dataclasses.dataclass(frozen=True)
class OptionSpec:
    """How one field becomes a flag: its help, range and spelling.

    :ivar help: one sentence for ``--help`` (the default is appended unless ``default_text`` says
        otherwise).
    :ivar min: smallest allowed value (inclusive); ``gt``: exclusive lower bound; ``max``: largest.
    :ivar flag: the flag, when not ``--<field-with-dashes>``.
    :ivar metavar: the value's name in ``--help``.
    :ivar default_text: what ``--help`` shows as the default (``"--lr"``, ``"the recipe's"``);
        ``""`` shows none.
    :ivar const: the value of the flag given without a value (its value is then optional:
        ``--math-think-tag`` alone means ``</think>``); ``None``: the flag needs its value.
    """

    help: str = ""
    min: float | None = None
    gt: float | None = None
    max: float | None = None
    flag: str | None = None
    metavar: str | None = None
    default_text: str | None = None
    const: Any = None


def option(default: Any, help: str = "", *, min: float | None = None, gt: float | None = None,
           max: float | None = None, flag: str | None = None, metavar: str | None = None,
           default_text: str | None = None, const: Any = None) -> Any:
    """Declare one option field of an :class:`Options` class (see the module docstring)."""
    spec = OptionSpec(help=help, min=min, gt=gt, max=max, flag=flag, metavar=metavar, default_text=default_text,
                      const=const)
    return dataclasses.field(default=default, metadata={SPEC_KEY: spec})


@dataclasses.dataclass(frozen=True)
class FieldKind:
    """What a field's annotation means for parsing: the scalar type, choices, repeatable, optional."""

    scalar: type
    choices: tuple[str, ...] | None = None
    repeated: bool = False
    optional: bool = False

    @classmethod
    def of(cls, annotation: Any, where: str) -> FieldKind:
        optional = False
        origin = typing.get_origin(annotation)
        if origin in (typing.Union, types.UnionType):
            members = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(members) != 1:
                raise TypeError(f"{where}: only 'X | None' unions are options, not {annotation!r}")
            optional, annotation = True, members[0]
            origin = typing.get_origin(annotation)
        if origin is Literal:
            choices = typing.get_args(annotation)
            if not all(isinstance(choice, str) for choice in choices):
                raise TypeError(f"{where}: Literal options take strings, not {choices!r}")
            return cls(str, tuple(choices), optional=optional)
        if origin is tuple:
            args = typing.get_args(annotation)
            if len(args) != 2 or args[1] is not Ellipsis or args[0] not in (str, int, float):
                raise TypeError(f"{where}: repeatable options are tuple[str, ...] (or int, float), not {annotation!r}")
            return cls(args[0], repeated=True, optional=optional)
        if annotation in (bool, int, float, str, Path):
            return cls(annotation, optional=optional)
        raise TypeError(f"{where}: no option type for annotation {annotation!r}")


@dataclasses.dataclass(frozen=True)
class OptionField:
    """One declared option: its dataclass field, parsed annotation and spec."""

    name: str
    kind: FieldKind
    default: Any
    spec: OptionSpec
    owner: type[Options]

    @property
    def flag(self) -> str:
        return self.spec.flag or "--" + self.name.replace("_", "-")

    def help_text(self) -> str:
        shown = self.spec.default_text
        if shown is None:
            shown = _show(self.default)
        return f"{self.spec.help} (default: {shown})" if shown else self.spec.help

    def argparse_kwargs(self) -> dict[str, Any]:
        """The ``add_argument`` keywords of this field."""
        kind = self.kind
        kwargs: dict[str, Any] = {"dest": self.name, "help": self.help_text()}
        if self.spec.metavar:
            kwargs["metavar"] = self.spec.metavar
        if kind.scalar is bool and not kind.repeated:
            kwargs.pop("metavar", None)
            kwargs["action"] = argparse.BooleanOptionalAction   # --no-X too: a flag can undo a file
            kwargs["default"] = self.default
            return kwargs
        kwargs["type"] = _parser_type(kind.scalar)
        if kind.choices:
            kwargs["choices"] = kind.choices
        if kind.repeated:
            kwargs["action"] = "append"
            kwargs["default"] = None        # argparse appends onto a default list; the default is applied later
        else:
            kwargs["default"] = self.default
        if self.spec.const is not None:
            kwargs.update(nargs="?", const=self.spec.const)
        return kwargs

    def convert(self, raw: Any) -> Any:
        """The typed value of ``raw`` (what argparse, a test or a config file gave), checked;
        ``UsageError`` naming the flag when it is not allowed."""
        kind = self.kind
        if raw is None:
            if kind.repeated and not kind.optional:
                return tuple(self.default)
            if kind.optional or self.default is None:
                return None
            raise UsageError(f"{self.flag} needs a value")
        if kind.repeated:
            if isinstance(raw, str) or not isinstance(raw, (list, tuple)):
                raw = [raw]
            return tuple(self._scalar(item) for item in raw)
        return self._scalar(raw)

    def _scalar(self, raw: Any) -> Any:
        kind, flag = self.kind, self.flag
        if kind.scalar is bool:
            if not isinstance(raw, bool):
                raise UsageError(f"{flag}: expected true or false, got {raw!r}")
            return raw
        try:
            if kind.scalar is int and (isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer())):
                raise ValueError
            value = kind.scalar(raw)
            if isinstance(value, float) and math.isnan(value):
                raise ValueError
        except (TypeError, ValueError):
            raise UsageError(f"{flag}: expected {kind.scalar.__name__}, got {raw!r}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise UsageError(f"{flag}: expected a finite number, got {raw!r}")
        if kind.choices and value not in kind.choices:
            raise UsageError(f"{flag} {value!r}: choose one of {', '.join(kind.choices)}")
        spec = self.spec
        if spec.min is not None and value < spec.min:
            raise UsageError(f"{flag} {value}: must be >= {_show(spec.min)}")
        if spec.gt is not None and value <= spec.gt:
            raise UsageError(f"{flag} {value}: must be > {_show(spec.gt)}")
        if spec.max is not None and value > spec.max:
            raise UsageError(f"{flag} {value}: must be <= {_show(spec.max)}")
        return value


@dataclass_transform(kw_only_default=True, frozen_default=True, field_specifiers=(option,))
class Options:
    """Base of every option declaration (see the module docstring).

    Subclasses are made frozen, keyword-only dataclasses; class keywords ``group`` (the ``--help``
    section) and ``description`` (its one-line heading) are required and optional.
    """

    group: ClassVar[str] = "general"
    description: ClassVar[str] = ""

    if TYPE_CHECKING:
        # Every subclass is made a dataclass in ``__init_subclass__``; declared here so that
        # ``dataclasses.fields`` accepts ``type[Options]`` (a DataclassInstance to the checker).
        __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    def __init_subclass__(cls, *, group: str | None = None, description: str | None = None,
                          **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if group is not None:
            cls.group = group
        if description is not None:
            cls.description = description
        dataclasses.dataclass(frozen=True, kw_only=True)(cls)

    @classmethod
    def of(cls: type[OptionsT], config: HoldsOptions) -> OptionsT:
        """This class's values in the run configured by ``config``, converted and checked."""
        return cls.from_values(vars(config.option))

    @classmethod
    def from_values(cls: type[OptionsT], values: dict[str, Any]) -> OptionsT:
        """An instance from ``name -> raw value`` (a parsed namespace's ``vars``, a test's keywords);
        fields missing from ``values`` take their declared default."""
        typed = {}
        for spec in option_fields(cls):
            raw = values.get(spec.name, spec.default if not spec.kind.repeated else None)
            typed[spec.name] = spec.convert(raw)
        instance = cls(**typed)
        instance.check()
        return instance

    @classmethod
    def defaults(cls: type[OptionsT]) -> OptionsT:
        """Every field at its declared default."""
        return cls.from_values({})

    def check(self) -> None:
        """Cross-field rules; raise :class:`plasmid.errors.UsageError` (one line, naming the flags)."""


_FIELDS: dict[type, tuple[OptionField, ...]] = {}


def option_fields(cls: type[Options]) -> tuple[OptionField, ...]:
    """The option fields of ``cls``, in declaration order (bases first)."""
    if cls not in _FIELDS:
        hints = typing.get_type_hints(cls)
        found = []
        for item in dataclasses.fields(cls):
            spec = item.metadata.get(SPEC_KEY)
            if spec is None:
                raise TypeError(f"{cls.__qualname__}.{item.name}: declare option fields with plasmid.options.option()")
            kind = FieldKind.of(hints[item.name], f"{cls.__qualname__}.{item.name}")
            found.append(OptionField(item.name, kind, item.default, spec, cls))
        _FIELDS[cls] = tuple(found)
    return _FIELDS[cls]


def walk_fields(classes: typing.Iterable[type[Options]]) -> Iterator[OptionField]:
    for cls in classes:
        yield from option_fields(cls)


def _parser_type(scalar: type) -> Callable[[str], Any]:
    if scalar is int:
        return int
    if scalar is float:
        return float
    if scalar is Path:
        return Path
    return str


def _show(value: Any) -> str:
    """A default as ``--help`` shows it; ``""`` for none."""
    if value is None or value == ():
        return ""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ", ".join(map(str, value))
    return str(value)


__all__ = ["OptionField", "OptionSpec", "Options", "option", "option_fields"]
