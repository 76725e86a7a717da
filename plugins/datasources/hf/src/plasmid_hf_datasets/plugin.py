"""Hook implementations of plasmid-hf-datasets: its options, their checks, the ``hf`` source
(``datasets`` is imported only when the source is built)."""

from __future__ import annotations

from collections.abc import Callable

from plasmid import hookimpl
from plasmid.config import Config, OptionParser
from plasmid.errors import UsageError
from plasmid.kernel_options import GeneralOptions
from plasmid_hf_datasets.options import HfDatasetOptions


@hookimpl
def plasmid_addoption(parser: OptionParser) -> None:
    parser.add_options(HfDatasetOptions)


@hookimpl
def plasmid_configure(config: Config) -> None:
    """When ``hf`` is the chosen source, ``--hf-path`` and ``--model`` must be given (its
    tokenizer encodes the prompts; there is no recipe model), checked before any model or engine
    is built; the data itself is opened and checked when the source is built at start-up."""
    if config.option.datasource != "hf":
        return
    if HfDatasetOptions.of(config).hf_path is None:
        raise UsageError("--datasource hf needs --hf-path PATH (a saved dataset directory, a data file, or a "
                         "builder such as json with --hf-data-files)")
    if not GeneralOptions.of(config).model:
        raise UsageError("--datasource hf needs --model DIR, a Hugging Face model: its tokenizer encodes the "
                         "prompts and its weights are trained")


@hookimpl
def plasmid_datasources(register: Callable[..., None]) -> None:
    register("hf", "plasmid_hf_datasets.source:HfDatasetSource")
