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
    """When ``retrieve`` is among ``--tools``, ``--retrieve-docs`` must name a file of documents
    that can be used, checked (read and parsed) before any model or engine is built; the tool
    indexes the same documents without reading the file again."""
    if "retrieve" not in chosen_tools(config):
        return
    options = RetrieveOptions.of(config)
    if options.retrieve_docs is None:
        raise UsageError("--tools retrieve needs --retrieve-docs PATH (a .jsonl or .txt file of documents)")
    from plasmid_basic_tools.retrieve import read_documents

    read_documents(options.retrieve_docs, options.retrieve_text_key)


@hookimpl
def plasmid_tools(register: Callable[..., None]) -> None:
    register("calculator", "plasmid_basic_tools.calculator:Calculator")
    register("retrieve", "plasmid_basic_tools.retrieve:Retrieve")
