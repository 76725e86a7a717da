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
    special tokens it adds, e.g. ``<bos>``). Chat mode (``--apply-chat-template``): a prompt is a
    list of ``{"role", "content"}`` messages, or a string taken as one user message, encoded by
    ``tokenizer.apply_chat_template(messages, add_generation_prompt=True)``.
    """

    def __init__(self, model: str, chat: bool) -> None:
        self.chat = chat
        self.tokenizer = load_tokenizer(str(model))
        if chat and not getattr(self.tokenizer, "chat_template", None):
            raise UsageError(f"--apply-chat-template: the tokenizer of --model {model} has no chat template; "
                             f"use a chat model or drop --apply-chat-template")

    def check(self, prompt: Any, location: str) -> str | Messages:
        """The prompt as stored on samples (chat mode: always messages); errors name ``location``."""
        if not self.chat:
            if isinstance(prompt, str) and prompt:
                return prompt
            if isinstance(prompt, list):
                raise UsageError(f"{location}: the prompt is a list (chat messages?); add --apply-chat-template")
            raise UsageError(f"{location}: the prompt must be a non-empty string, got {prompt!r}")
        if isinstance(prompt, str) and prompt:
            return [{"role": "user", "content": prompt}]
        if isinstance(prompt, list) and prompt and all(_is_message(message) for message in prompt):
            return [{"role": message["role"], "content": message["content"]} for message in prompt]
        raise UsageError(f"{location}: with --apply-chat-template the prompt must be a string or a non-empty list "
                         f"of {{'role': ..., 'content': ...}} messages, got {prompt!r}")

    def __call__(self, prompt: str | Messages) -> list[int]:
        """Token ids of a prompt that :meth:`check` returned."""
        if self.chat:
            encoded = self.tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True,
                                                         return_dict=True)
            return list(encoded["input_ids"])
        return list(self.tokenizer(prompt)["input_ids"])


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
