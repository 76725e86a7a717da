"""Hook implementations of plasmid-jsonl: its options, the files they name, the ``jsonl`` source."""

from __future__ import annotations

from collections.abc import Callable

from plasmid import hookimpl
from plasmid.config import Config, OptionParser
from plasmid.errors import UsageError
from plasmid.kernel_options import GeneralOptions
from plasmid_jsonl.options import JsonlOptions


@hookimpl
def plasmid_addoption(parser: OptionParser) -> None:
    parser.add_options(JsonlOptions)


@hookimpl
def plasmid_configure(config: Config) -> None:
    """When ``jsonl`` is the chosen source, its files must exist and ``--model`` must be given
    (its tokenizer encodes the prompts; there is no recipe model), checked before any model or
    engine is built; the options class cannot say so, as it holds for this source only."""
    if config.option.datasource != "jsonl":
        return
    options = JsonlOptions.of(config)
    if options.prompt_data is None:
        raise UsageError("--datasource jsonl needs --prompt-data PATH (a .jsonl or .parquet file)")
    if not GeneralOptions.of(config).model:
        raise UsageError("--datasource jsonl needs --model DIR, a local Hugging Face model directory: its "
                         "tokenizer encodes the prompts and its weights are trained")
    for flag, path in (("--prompt-data", options.prompt_data), ("--eval-prompt-data", options.eval_prompt_data)):
        if path is not None and not path.is_file():
            raise UsageError(f"{flag} {path}: no such file")


@hookimpl
def plasmid_datasources(register: Callable[..., None]) -> None:
    register("jsonl", "plasmid_jsonl.source:JsonlSource")
