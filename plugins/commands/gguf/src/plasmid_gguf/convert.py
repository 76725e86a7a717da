"""A GGUF file as a Hugging Face model directory.

transformers reads a GGUF (``from_pretrained(folder, gguf_file=name)``) and dequantises every tensor
to float, but the model it returns remembers the GGUF as its quantization and refuses
``save_pretrained`` ("quantized with gguf and is not serializable"). So the model class is built
again from the same config without ``quantization_config`` and given the loaded state dict: the
weights, and so the logits, are exactly the GGUF-loaded model's (in float32; ``bfloat16`` rounds
them once). The tokenizer (vocabulary, merges, special tokens, chat template) is the one
transformers builds from the GGUF's metadata, saved as ``tokenizer.json`` and its config.

Needs the ``gguf`` and ``accelerate`` packages (:func:`check_dependencies`); never uses the network
(``HF_HUB_OFFLINE=1`` and ``local_files_only`` for the load).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plasmid.errors import UsageError

#: Packages the GGUF load needs beyond transformers and torch -> why.
NEEDED = {"gguf": "to read GGUF files", "accelerate": "for transformers' GGUF loading"}

#: Settings of the GGUF load that transformers would save into ``tokenizer_config.json``: they say
#: how this process loaded the tokenizer, not what a later load of the directory should do.
LOAD_ONLY_SETTINGS = ("local_files_only", "is_local")

#: ``--dtype`` choices: the dtype of the written weights.
DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class Converted:
    """What :func:`write_model_dir` wrote.

    :ivar architecture: the model class, e.g. ``LlamaForCausalLM``.
    :ivar parameters: number of parameters (tied weights counted once).
    :ivar vocab_size: the model's vocabulary size (rows of its embedding).
    :ivar chat_template: whether the tokenizer has a chat template.
    """

    architecture: str
    parameters: int
    vocab_size: int
    chat_template: bool


def check_dependencies() -> None:
    """Refuse (one-line :class:`UsageError` naming the package to ``pip install``) when a package of
    :data:`NEEDED` is not installed. Imports nothing."""
    for name, why in NEEDED.items():
        if importlib.util.find_spec(name) is None:
            raise UsageError(f"model-from-gguf needs the {name} package {why}, which is not installed: "
                             f"pip install {name}")


def check_architecture(path: Path) -> str:
    """The GGUF's ``general.architecture``, after checking that transformers can load it; a file
    that gguf cannot read or an architecture transformers does not convert is a :class:`UsageError`.
    Reads the header only (the file is memory-mapped)."""
    from gguf import GGUFReader
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    try:
        field = GGUFReader(path).fields["general.architecture"]
        architecture = str(field.contents())
    except KeyError:
        raise UsageError(f"{path}: the GGUF header has no general.architecture") from None
    except Exception as exc:  # noqa: BLE001 - gguf raises many kinds for a damaged file; each is the user's file
        raise UsageError(f"{path}: gguf cannot read the file: {type(exc).__name__}: {_first_line(exc)}") from None
    if architecture not in GGUF_SUPPORTED_ARCHITECTURES:
        raise UsageError(f"{path}: architecture {architecture!r} is not one transformers loads from GGUF (it loads "
                         f"{', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES)[:12])}, ...)")
    return architecture


def load_gguf(path: Path) -> tuple[Any, Any]:
    """``(model, tokenizer)`` as transformers loads them from GGUF file ``path``: the model in
    float32, in eval mode, still marked as GGUF-quantized (not serializable). No network."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    folder, name = str(path.parent), path.name
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32,
                                                                  local_files_only=True)
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - transformers raises many kinds; each is about the user's file
        raise UsageError(f"{path}: transformers cannot load it from GGUF: {type(exc).__name__}: "
                         f"{_first_line(exc)}") from None
    return model.eval(), tokenizer


def serializable_model(gguf_model: Any, dtype: str = "float32") -> Any:
    """A model of ``gguf_model``'s class and config, without ``quantization_config``, holding its
    weights (an exact copy) in ``dtype``; ``save_pretrained`` accepts it."""
    import torch

    settings = gguf_model.config.to_dict()
    settings.pop("quantization_config", None)
    config = type(gguf_model.config).from_dict(settings)
    model = type(gguf_model)(config)
    model.load_state_dict(gguf_model.state_dict(), strict=True)
    model.generation_config = gguf_model.generation_config
    return model.to(getattr(torch, dtype)).eval()


def write_model_dir(path: Path, directory: Path, dtype: str = "float32") -> Converted:
    """Convert GGUF file ``path`` into the existing, empty ``directory``: ``config.json`` (no
    ``quantization_config``), ``generation_config.json``, ``model.safetensors`` in ``dtype``, and the
    tokenizer files (``tokenizer.json``, ``tokenizer_config.json``, the chat template).

    The tokenizer's ``model_max_length`` is set to the model's ``max_position_embeddings`` (a GGUF
    carries none; transformers would leave it unbounded); how it was loaded
    (:data:`LOAD_ONLY_SETTINGS`) is not saved with it."""
    if dtype not in DTYPES:
        raise UsageError(f"--dtype {dtype}: choose one of {', '.join(DTYPES)}")
    gguf_model, tokenizer = load_gguf(path)
    model = serializable_model(gguf_model, dtype)
    del gguf_model
    model.save_pretrained(str(directory))
    context = getattr(model.config, "max_position_embeddings", None)
    if context:
        tokenizer.model_max_length = int(context)
    for how_it_was_loaded in LOAD_ONLY_SETTINGS:
        tokenizer.init_kwargs.pop(how_it_was_loaded, None)
    tokenizer.save_pretrained(str(directory))
    return Converted(architecture=type(model).__name__, parameters=model.num_parameters(),
                     vocab_size=int(model.get_input_embeddings().weight.shape[0]),
                     chat_template=bool(getattr(tokenizer, "chat_template", None)))


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0]
