"""Hook implementations of plasmid-tools: its options, the ``calculator`` and ``retrieve`` tools."""

from __future__ import annotations

from collections.abc import Callable

from plasmid import hookimpl
from plasmid.config import Config, OptionParser
from plasmid.errors import UsageError
from plasmid_basic_tools.options import CalculatorOptions, RetrieveOptions


@hookimpl
def plasmid_addoption(parser: OptionParser) -> None:
    parser.add_options(CalculatorOptions)
    parser.add_options(RetrieveOptions)


def chosen_tools(config: Config) -> list[str]:
    """The tool names of ``--tools`` (each value may list several, comma-separated)."""
    return [name.strip() for value in (getattr(config.option, "tools", None) or []) for name in value.split(",")]


@hookimpl
def plasmid_configure(config: Config) -> None:
    """When ``retrieve`` is among ``--tools``, ``--retrieve-docs`` must name a non-empty file,
    checked before any model or engine is built (the tool parses it when it is built)."""
    if "retrieve" not in chosen_tools(config):
        return
    path = RetrieveOptions.of(config).retrieve_docs
    if path is None:
        raise UsageError("--tools retrieve needs --retrieve-docs PATH (a .jsonl or .txt file of documents)")
    if not path.is_file():
        raise UsageError(f"--retrieve-docs {path}: no such file")
    if path.stat().st_size == 0:
        raise UsageError(f"--retrieve-docs {path}: the file has no documents")


@hookimpl
def plasmid_tools(register: Callable[..., None]) -> None:
    register("calculator", "plasmid_basic_tools.calculator:Calculator")
    register("retrieve", "plasmid_basic_tools.retrieve:Retrieve")
