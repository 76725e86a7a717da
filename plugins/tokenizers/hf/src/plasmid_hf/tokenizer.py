"""The ``hf`` tokenizer: ``transformers.AutoTokenizer`` of the ``--model`` directory."""

from __future__ import annotations

from typing import Any

from plasmid.config import Config
from plasmid.errors import UsageError
from plasmid.kernel_options import GeneralOptions


def model_tokenizer(config: Config) -> Any:
    """The tokenizer saved with ``--model`` (a :class:`plasmid.protocols.Tokenizer`); loaded
    from the local directory only, never from a hub."""
    model = GeneralOptions.of(config).model
    if not model:
        raise UsageError("tokenizer hf: --model is not set; give a local Hugging Face model directory")
    import transformers

    transformers.utils.logging.disable_progress_bar()
    try:
        return transformers.AutoTokenizer.from_pretrained(str(model), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise UsageError(f"tokenizer hf: no tokenizer could be loaded from --model {model}: {exc}") from None


#: The options the factory reads (``plasmid plugins show hf`` lists their flags).
model_tokenizer.option_classes = (GeneralOptions,)  # type: ignore[attr-defined]
