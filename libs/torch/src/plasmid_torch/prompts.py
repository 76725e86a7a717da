"""From a data row's prompt to token ids: plain text, or chat messages through the chat template
(shared by the data sources that read prompt files: jsonl, hf); and which prompts of a batch are
the same (:func:`shared_prompts`: torchgen's prefill and torchtrain's forward pass each run a
group's prompt once)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from plasmid.errors import UsageError
from plasmid_torch.hf import load_tokenizer

Messages = list[dict[str, str]]


class PromptEncoder:
    """Checks prompts and encodes them with the tokenizer of ``model`` (a model directory).

    Plain mode: a prompt is a non-empty string, encoded as the tokenizer encodes text (with the
    special tokens it adds, e.g. ``<bos>``). Chat mode (``flag``, ``--apply-chat-template`` by
    default, was given): a prompt is a list of ``{"role", "content"}`` messages, or a string taken
    as one user message, encoded by ``tokenizer.apply_chat_template(messages,
    add_generation_prompt=True)``.

    Text the tokenizer cannot encode is a one-line :class:`UsageError` naming the character
    (:func:`unencodable`): the tokenizer raised, or it gave its unknown token where the text did
    not hold it. The caller adds where the prompt came from.
    """

    def __init__(self, model: str, chat: bool, flag: str = "--apply-chat-template") -> None:
        self.chat, self.flag = chat, flag
        self.tokenizer = load_tokenizer(str(model))
        if chat and not getattr(self.tokenizer, "chat_template", None):
            raise UsageError(f"{flag}: the tokenizer of --model {model} has no chat template; "
                             f"use a chat model or drop {flag}")

    @property
    def chat_template_flag(self) -> str:
        """``flag`` when prompts are encoded as plain text although the tokenizer has a chat
        template (:class:`plasmid.types.PromptReport`), else ``""``."""
        return self.flag if not self.chat and getattr(self.tokenizer, "chat_template", None) else ""

    def check(self, prompt: Any, location: str) -> str | Messages:
        """The prompt as stored on samples (chat mode: always messages); errors name ``location``."""
        if not self.chat:
            if isinstance(prompt, str) and prompt:
                return prompt
            if isinstance(prompt, list):
                raise UsageError(f"{location}: the prompt is a list (chat messages?); add {self.flag}")
            raise UsageError(f"{location}: the prompt must be a non-empty string, got {prompt!r}")
        if isinstance(prompt, str) and prompt:
            return [{"role": "user", "content": prompt}]
        if isinstance(prompt, list) and prompt and all(_is_message(message) for message in prompt):
            return [{"role": message["role"], "content": message["content"]} for message in prompt]
        raise UsageError(f"{location}: with {self.flag} the prompt must be a string or a non-empty list "
                         f"of {{'role': ..., 'content': ...}} messages, got {prompt!r}")

    def __call__(self, prompt: str | Messages) -> list[int]:
        """Token ids of a prompt that :meth:`check` returned; :class:`UsageError` when the
        tokenizer cannot encode it."""
        texts = [prompt] if isinstance(prompt, str) else [message["content"] for message in prompt]
        try:
            if self.chat:
                encoded = self.tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True,
                                                             return_dict=True)
                ids = list(encoded["input_ids"])
            else:
                ids = list(self.tokenizer(prompt)["input_ids"])
        except Exception as exc:  # noqa: BLE001 - a tokenizer's refusal of text is the data's problem
            raise unencodable(self.tokenizer, texts, f"{type(exc).__name__}: {exc}") from None
        unknown = getattr(self.tokenizer, "unk_token_id", None)
        if unknown is not None and unknown in ids:
            marker = str(getattr(self.tokenizer, "unk_token", "") or "")
            if not marker or not any(marker in text for text in texts):
                raise unencodable(self.tokenizer, texts, f"it gave its unknown token {marker or unknown!r}")
        return ids


def unencodable(tokenizer: Any, texts: list[str], reason: str) -> UsageError:
    """The error for ``texts`` that ``tokenizer`` cannot encode (``reason``: what it did),
    naming the first character it cannot encode alone, when one is found."""
    for char in dict.fromkeys("".join(texts)):
        if not _encodes(tokenizer, char):
            return UsageError(f"the tokenizer cannot encode the character {char!r} (U+{ord(char):04X}) of the prompt "
                              f"({reason.splitlines()[0]}); remove it from the data or use a model whose "
                              f"tokenizer has it")
    return UsageError(f"the tokenizer cannot encode the prompt ({reason.splitlines()[0]})")


def _encodes(tokenizer: Any, char: str) -> bool:
    try:
        ids = list(tokenizer(char, add_special_tokens=False)["input_ids"])
    except Exception:  # noqa: BLE001 - the refusal is what is looked for
        return False
    unknown = getattr(tokenizer, "unk_token_id", None)
    return unknown is None or unknown not in ids or str(getattr(tokenizer, "unk_token", "")) == char


def _is_message(message: Any) -> bool:
    return isinstance(message, dict) and all(isinstance(message.get(key), str) for key in ("role", "content"))


def shared_prompts(prompts: Sequence[Sequence[int]]) -> tuple[list[int], list[int]] | None:
    """``(first, group)`` when some of ``prompts`` are equal, else ``None``: ``first[u]`` is the
    index of distinct prompt ``u``'s first occurrence (distinct prompts in order of first
    appearance), ``group[i]`` the distinct prompt of ``prompts[i]``."""
    index: dict[tuple[int, ...], int] = {}
    group = [index.setdefault(tuple(prompt), len(index)) for prompt in prompts]
    if len(index) == len(group):
        return None
    first = [0] * len(index)
    for position in reversed(range(len(group))):
        first[group[position]] = position
    return first, group
