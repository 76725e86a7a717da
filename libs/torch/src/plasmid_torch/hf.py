"""Loading Hugging Face models and tokenizers from local directories (no hub access)."""

from __future__ import annotations

import functools
import inspect
import json
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
    if saves_generic_tokenizer(directory):
        return transformers.PreTrainedTokenizerFast.from_pretrained(str(directory))
    return transformers.AutoTokenizer.from_pretrained(str(directory))


#: Tokenizer classes that only wrap a saved ``tokenizer.json`` (plasmid's tiny char tokenizers save
#: ``TokenizersBackend``). transformers 5's ``AutoTokenizer`` swaps in the model type's own class for
#: some types whatever the saved class (qwen2: ``Qwen2Tokenizer``, whose byte-level pre-tokenizer
#: drops every space and newline of a char vocabulary), so such a directory is loaded as it was saved.
GENERIC_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def saves_generic_tokenizer(directory: str | Path) -> bool:
    """Whether ``directory``'s ``tokenizer_config.json`` declares one of
    :data:`GENERIC_TOKENIZER_CLASSES` beside a ``tokenizer.json`` (then it is loaded with
    ``PreTrainedTokenizerFast``, the class that keeps ``tokenizer.json`` as saved)."""
    config = Path(directory) / "tokenizer_config.json"
    if not config.is_file() or not (Path(directory) / "tokenizer.json").is_file():
        return False
    return json.loads(config.read_text(encoding="utf-8")).get("tokenizer_class") in GENERIC_TOKENIZER_CLASSES


def load_causal_lm(path: str, dtype: str = "float32") -> Any:
    """``AutoModelForCausalLM`` from local directory ``path`` in ``dtype``, in eval mode on CPU; a
    vision-language model (a config with ``vision_config``) through ``AutoModelForImageTextToText``."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    directory = _check_model_dir(path)
    model = model_class(directory).from_pretrained(str(directory), dtype=getattr(torch, dtype))
    return model.eval()


def cache_argument(model: Any) -> str:
    """The keyword of ``model.forward`` that takes a KV cache: ``cache`` where its signature lists
    it (transformers renamed ``past_key_values``), else ``past_key_values``. A peft model is asked
    about the model it wraps (its own forward passes keywords through)."""
    target = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    return "cache" if "cache" in inspect.signature(target.forward).parameters else "past_key_values"


def model_class(directory: str | os.PathLike[str]) -> Any:
    """The ``transformers`` auto class for model directory ``directory``: ``AutoModelForImageTextToText``
    when its ``config.json`` has a ``vision_config`` (a vision-language model), else ``AutoModelForCausalLM``."""
    import transformers

    config = json.loads((Path(directory) / "config.json").read_text(encoding="utf-8"))
    vision = "vision_config" in config
    return transformers.AutoModelForImageTextToText if vision else transformers.AutoModelForCausalLM
