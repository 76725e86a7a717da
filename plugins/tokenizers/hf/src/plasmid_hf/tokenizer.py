"""The ``hf`` tokenizer: ``transformers.AutoTokenizer`` of the ``--model`` directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from plasmid.config import Config
from plasmid.errors import UsageError
from plasmid.kernel_options import GeneralOptions

#: Files of which a saved Hugging Face tokenizer has at least one (fast tokenizers, the config
#: that names the class, sentencepiece models, BPE and WordPiece vocabularies).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "spiece.model",
                   "sentencepiece.bpe.model", "vocab.json", "vocab.txt")


def check_tokenizer_files(model: str | Path) -> None:
    """Refuse (one-line :class:`UsageError`) a model directory without any tokenizer file: one
    that holds weights only would give a tokenizer with an empty vocabulary and empty prompts.
    A directory that does not exist yet is left to whoever creates it (a recipe)."""
    directory = Path(model)
    if not directory.is_dir() or any((directory / name).is_file() for name in TOKENIZER_FILES):
        return
    present = ", ".join(sorted(path.name for path in directory.iterdir())[:8]) or "nothing"
    raise UsageError(f"--model {model} has no tokenizer (none of {', '.join(TOKENIZER_FILES[:3])}, ...; it holds "
                     f"{present}); save the model's tokenizer there (tokenizer.save_pretrained(DIR)) or choose "
                     f"another --tokenizer")


def saves_generic_tokenizer(model: str | Path) -> bool:
    """Whether the model directory saved a tokenizer of a class that only wraps its
    ``tokenizer.json`` (``TokenizersBackend``, as plasmid's tiny char tokenizers do, or
    ``PreTrainedTokenizerFast``). Such a directory is loaded with ``PreTrainedTokenizerFast``:
    transformers 5's ``AutoTokenizer`` swaps in the model type's own class for some types whatever
    the saved class (qwen2: ``Qwen2Tokenizer``, whose byte-level pre-tokenizer drops the spaces and
    newlines of a char vocabulary). The same rule as ``plasmid_torch.hf.load_tokenizer``."""
    config, saved = Path(model) / "tokenizer_config.json", Path(model) / "tokenizer.json"
    if not (config.is_file() and saved.is_file()):
        return False
    return json.loads(config.read_text(encoding="utf-8")).get("tokenizer_class") in GENERIC_CLASSES


#: Tokenizer classes that only wrap a saved ``tokenizer.json`` (see :func:`saves_generic_tokenizer`).
GENERIC_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def model_tokenizer(config: Config) -> Any:
    """The tokenizer saved with ``--model`` (a :class:`plasmid.protocols.Tokenizer`, with the
    model's every end-of-sequence id as ``eos_ids``: :func:`eos_ids`); loaded from the local
    directory only, never from a hub. A directory without tokenizer files, or one transformers
    cannot load, is a one-line :class:`UsageError`."""
    model = GeneralOptions.of(config).model
    if not model:
        raise UsageError("tokenizer hf: --model is not set; give a local Hugging Face model directory")
    check_tokenizer_files(model)
    import transformers

    transformers.utils.logging.disable_progress_bar()
    try:
        loader = transformers.PreTrainedTokenizerFast if saves_generic_tokenizer(model) else transformers.AutoTokenizer
        tokenizer = loader.from_pretrained(str(model), local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - transformers raises many kinds; each is the user's model dir
        first_line = (str(exc).strip().splitlines() or [""])[0]
        raise UsageError(f"tokenizer hf: no tokenizer could be loaded from --model {model}: "
                         f"{type(exc).__name__}: {first_line}") from None
    tokenizer.eos_ids = eos_ids(model, tokenizer.eos_token_id)
    return tokenizer


def eos_ids(model: str | Path, eos_token_id: int | None) -> tuple[int, ...]:
    """The model's end-of-sequence ids (:class:`plasmid.protocols.SupportsEosIds`): the
    tokenizer's ``eos_token_id``, then the ``eos_token_id`` (an id or a list of ids, as Llama 3
    writes them) of ``config.json``, then of ``generation_config.json``, each once; files that
    are missing or unreadable add nothing."""
    found: list[int] = [] if eos_token_id is None else [int(eos_token_id)]
    for name in ("config.json", "generation_config.json"):
        try:
            value = json.loads((Path(model) / name).read_text(encoding="utf-8")).get("eos_token_id")
        except (OSError, ValueError, AttributeError):
            continue
        values = value if isinstance(value, list) else [value]
        found += [int(item) for item in values if isinstance(item, int) and not isinstance(item, bool) and item >= 0]
    return tuple(dict.fromkeys(found))


#: The options the factory reads (``plasmid plugins show hf`` lists their flags).
model_tokenizer.option_classes = (GeneralOptions,)  # type: ignore[attr-defined]
