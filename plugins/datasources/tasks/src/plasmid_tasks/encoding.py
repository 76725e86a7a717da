"""Prompt text to token ids: the model's tokenizer when there is a model, else the char tokenizer."""

from __future__ import annotations

import functools

from plasmid_torch.tiny import BOS_ID, DIGITS_ALPHABET, SPECIAL_TOKENS

#: character -> id in :func:`plasmid_torch.tiny.char_tokenizer` (its ids follow the special tokens).
CHAR_IDS = {char: len(SPECIAL_TOKENS) + position for position, char in enumerate(DIGITS_ALPHABET)}


def char_token_ids(prompt: str, alphabet: str = DIGITS_ALPHABET) -> list[int]:
    """``[<bos>] + one id per character``: what ``plasmid_torch.tiny.char_tokenizer(alphabet)(prompt)``
    gives, computed directly (no tokenizer object, no transformers import)."""
    ids = CHAR_IDS if alphabet == DIGITS_ALPHABET else _char_ids(alphabet)
    return [BOS_ID] + [ids[char] for char in prompt]


@functools.lru_cache(maxsize=4)
def _char_ids(alphabet: str) -> dict[str, int]:
    return {char: len(SPECIAL_TOKENS) + position for position, char in enumerate(alphabet)}


class PromptEncoder:
    """Encodes task prompts with the tokenizer of ``model`` (a local Hugging Face model
    directory), or with :func:`char_token_ids` of ``alphabet`` when ``model`` is ``None``.

    With ``chat`` (``--task-apply-chat-template``) each prompt is one user message rendered by
    the model's chat template with its generation prompt. Text the model's tokenizer cannot
    encode is a one-line :class:`~plasmid.errors.UsageError` naming the character
    (:class:`plasmid_torch.prompts.PromptEncoder`, which does the model's encoding).
    """

    def __init__(self, model: str | None, alphabet: str = DIGITS_ALPHABET, chat: bool = False) -> None:
        self._encoder = None
        self._alphabet = alphabet
        if model is not None:
            from plasmid_torch.prompts import PromptEncoder as ModelEncoder

            self._encoder = ModelEncoder(str(model), chat=chat, flag="--task-apply-chat-template")

    @property
    def chat_template_flag(self) -> str:
        """The flag that would apply the model's chat template to prompts encoded as plain text
        (see :class:`plasmid.types.PromptReport`); ``""`` without a model."""
        return self._encoder.chat_template_flag if self._encoder is not None else ""

    def __call__(self, prompt: str) -> list[int]:
        """The prompt's token ids (a fresh list; tasks repeat their prompts, so each text is
        tokenized once)."""
        return list(self._encode(prompt))

    @functools.lru_cache(maxsize=1 << 16)  # noqa: B019 - one encoder per run; the cache lives as long
    def _encode(self, prompt: str) -> tuple[int, ...]:
        if self._encoder is None:
            return tuple(char_token_ids(prompt, self._alphabet))
        return tuple(self._encoder(self._encoder.check(prompt, "")))
