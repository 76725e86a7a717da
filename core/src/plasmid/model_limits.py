"""What a Hugging Face model directory says about its limits, read from its JSON files alone
(nothing is loaded, no torch): how many positions fit its context, and its vocabulary size.

The context is the model's ``max_position_embeddings`` in ``config.json`` (or the first of
:data:`CONTEXT_KEYS` that it has, also inside a nested ``text_config`` / ``llm_config``), or the
tokenizer's ``model_max_length`` in ``tokenizer_config.json`` when that is smaller and sane
(below :data:`UNSET_MODEL_MAX_LENGTH`: transformers writes ``1e30`` for "no limit"). The
start-up checks of prompts (:mod:`plasmid.prompt_limits`) and the engines that refuse requests
past the context (torchgen, the agent gateway) read the same figure, so they agree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: ``config.json`` keys that hold the number of positions, in the order they are looked for.
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")
#: Nested configs of multimodal models whose language model holds the keys.
NESTED_CONFIGS = ("text_config", "llm_config", "language_config")
#: ``model_max_length`` values at or above this mean "no limit" (transformers writes 1e30).
UNSET_MODEL_MAX_LENGTH = 10**9


@dataclass(frozen=True)
class ModelLimits:
    """The limits of the model in ``directory``.

    :ivar context: positions the model can attend over (prompt + response), or ``None`` when the
        directory names none.
    :ivar context_source: where :attr:`context` was read (``"max_position_embeddings in
        config.json"``), for messages.
    :ivar vocab_size: ``vocab_size`` of ``config.json`` (the embedding rows: valid ids are
        ``0 .. vocab_size - 1``), or ``None``.
    """

    directory: str
    context: int | None = None
    context_source: str = ""
    vocab_size: int | None = None

    def describe(self) -> str:
        """``the model at DIR has a context of N tokens (SOURCE)``, for messages."""
        return f"the model at {self.directory} has a context of {self.context} tokens ({self.context_source})"


def read_model_limits(directory: str | Path) -> ModelLimits:
    """The :class:`ModelLimits` of model directory ``directory``; a missing or unreadable file
    counts as naming nothing (the loaders report broken directories)."""
    config = _json(Path(directory) / "config.json")
    context, source = _config_context(config)
    tokenizer_limit = _count(_json(Path(directory) / "tokenizer_config.json").get("model_max_length"))
    if tokenizer_limit is not None and tokenizer_limit < UNSET_MODEL_MAX_LENGTH \
            and (context is None or tokenizer_limit < context):
        context, source = tokenizer_limit, "model_max_length in tokenizer_config.json"
    vocab = _count(config.get("vocab_size"))
    if vocab is None:
        vocab = next((found for inner in _nested(config) if (found := _count(inner.get("vocab_size"))) is not None),
                     None)
    return ModelLimits(str(directory), context, source, vocab)


def _config_context(config: dict[str, Any]) -> tuple[int | None, str]:
    for where, values in (("config.json", config),
                          *((f"{name} of config.json", config[name]) for name in NESTED_CONFIGS
                            if isinstance(config.get(name), dict))):
        for key in CONTEXT_KEYS:
            found = _count(values.get(key))
            if found is not None:
                return found, f"{key} in {where}"
    return None, ""


def _nested(config: dict[str, Any]) -> list[dict[str, Any]]:
    return [config[name] for name in NESTED_CONFIGS if isinstance(config.get(name), dict)]


def _count(value: Any) -> int | None:
    """``value`` as a positive whole number (JSON may write ``1e30``), else ``None``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 1 and float(value).is_integer():
        return int(value)
    return None


def _json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
