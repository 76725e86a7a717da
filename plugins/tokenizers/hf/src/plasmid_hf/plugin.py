"""Hook implementations of plasmid-hf (transformers is imported only when the tokenizer is built)."""

from __future__ import annotations

from collections.abc import Callable

from plasmid import hookimpl


@hookimpl
def plasmid_tokenizers(register: Callable[..., None]) -> None:
    register("hf", "plasmid_hf.tokenizer:model_tokenizer", default=True)
