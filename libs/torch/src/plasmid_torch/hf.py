"""Loading Hugging Face models and tokenizers from local directories (no hub access)."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

from plasmid.errors import UsageError


def _check_model_dir(path: str | os.PathLike[str]) -> Path:
    directory = Path(path)
    if not (directory / "config.json").is_file():
        raise UsageError(f"--model {path}: not a Hugging Face model directory (no config.json there)")
    return directory


@functools.lru_cache(maxsize=8)
def load_tokenizer(path: str) -> Any:
    """The tokenizer saved in model directory ``path`` (cached per process)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import transformers

    directory = _check_model_dir(path)
    return transformers.AutoTokenizer.from_pretrained(str(directory))


def load_causal_lm(path: str, dtype: str = "float32") -> Any:
    """``AutoModelForCausalLM`` from local directory ``path`` in ``dtype``, in eval mode on CPU."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    directory = _check_model_dir(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(directory), dtype=getattr(torch, dtype))
    return model.eval()
