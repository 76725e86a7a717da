"""From a reasoning-gym question to the sample's prompt and token ids.

With a chat model (its tokenizer has a chat template) the prompt is the messages
``[system, user]`` (no system message with ``--rg-system-prompt none``) encoded with the template
and a generation prompt; otherwise (the recipe's tiny model) it is the text
``system + "\\n" + question + "\\n"`` (just ``question + "\\n"`` without a system prompt), encoded
as the tokenizer encodes text.
"""

from __future__ import annotations

from typing import Any

from plasmid.errors import UsageError
from plasmid_reasoning_gym import gym


def system_prompts() -> dict[str, str]:
    gym.check_version()
    from reasoning_gym.utils import SYSTEM_PROMPTS

    return dict(SYSTEM_PROMPTS)


def system_prompt(key: str) -> str | None:
    """The text of ``--rg-system-prompt key`` (``None`` for ``none``)."""
    if key == "none":
        return None
    prompts = system_prompts()
    if key not in prompts:
        choices = [*sorted(prompts), "none"]
        raise UsageError(f"--rg-system-prompt {key!r}: choose one of {', '.join(choices)}"
                         f"{gym.close_matches(key, choices)}")
    return prompts[key]


def prompt_text(system: str | None, question: str) -> str:
    """The plain-text prompt (no chat template)."""
    return f"{system.rstrip()}\n{question}\n" if system else f"{question}\n"


class PromptEncoder:
    """Makes and encodes prompts with the tokenizer of ``model`` (a local Hugging Face model directory)."""

    def __init__(self, model: str, system: str | None) -> None:
        from plasmid_torch.hf import load_tokenizer

        self.model, self.system = model, system
        self.tokenizer = load_tokenizer(str(model))
        self.chat = bool(getattr(self.tokenizer, "chat_template", None))

    def prompt(self, question: str) -> Any:
        """The sample's prompt: chat messages for a chat model, else the text."""
        if not self.chat:
            return prompt_text(self.system, question)
        messages = [{"role": "system", "content": self.system}] if self.system else []
        return [*messages, {"role": "user", "content": question}]

    def encode(self, prompt: Any, where: str) -> list[int]:
        """The prompt's token ids; a :class:`UsageError` naming ``where`` when the tokenizer
        cannot encode it (a character the tiny model's alphabet lacks)."""
        try:
            if self.chat:
                encoded = self.tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True,
                                                             return_dict=False)
                return [int(token) for token in encoded]
            return [int(token) for token in self.tokenizer(prompt)["input_ids"]]
        except Exception as exc:  # noqa: BLE001 - tokenizers raise bare Exceptions
            raise UsageError(f"{where}: the tokenizer of --model {self.model} cannot encode the prompt "
                             f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); a model built "
                             f"for other --rg-* options? give another --run-dir or --model") from None
