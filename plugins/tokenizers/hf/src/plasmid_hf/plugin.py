"""Hook implementations of plasmid-hf (transformers is imported only when the tokenizer is built)."""

from __future__ import annotations

from collections.abc import Callable

from plasmid import hookimpl
from plasmid.config import Config
from plasmid.kernel_options import GeneralOptions


@hookimpl
def plasmid_configure(config: Config) -> None:
    """When ``hf`` is the chosen tokenizer, a ``--model`` directory without tokenizer files is
    refused now, before anything is built or written (transformers would load an empty one)."""
    model = GeneralOptions.of(config).model
    if config.option.tokenizer == "hf" and model:
        from plasmid_hf.tokenizer import check_tokenizer_files

        check_tokenizer_files(model)


@hookimpl
def plasmid_tokenizers(register: Callable[..., None]) -> None:
    register("hf", "plasmid_hf.tokenizer:model_tokenizer", default=True)
