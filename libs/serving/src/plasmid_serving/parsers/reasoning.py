"""The built-in reasoning parsers, ``<think>...</think>``, named as vLLM's and SGLang's ``--reasoning-parser``.

- ``deepseek_r1`` (SGLang: ``deepseek-r1``): DeepSeek-R1's template opens ``<think>`` in the prompt,
  so the model's text may start inside its reasoning; text without ``</think>`` is all reasoning
  (a turn cut short while thinking).
- ``qwen3``: Qwen3 writes ``<think>...</think>`` itself, or (its thinking-only templates) the
  prompt opens it and the text holds only ``</think>``; text with neither tag is all content
  (thinking turned off).

In both, a ``<think>`` that opens the text (after blanks) and is never closed makes the rest
reasoning, and the reasoning is what lies between the opening (or the start) and ``</think>``.
"""

from __future__ import annotations

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


class ThinkTags:
    """Reasoning between ``<think>`` and ``</think>``; see the module docstring.

    :param unclosed_is_reasoning: text with no tag at all is reasoning (else it is content).
    """

    def __init__(self, unclosed_is_reasoning: bool) -> None:
        self.unclosed_is_reasoning = unclosed_is_reasoning

    def split(self, text: str) -> tuple[str | None, int]:
        """``(reasoning, content_start)``; see :meth:`plasmid_serving.parsers.base.ReasoningParser.split`."""
        lead = len(text) - len(text.lstrip())
        opened = text.startswith(THINK_OPEN, lead)
        body = lead + len(THINK_OPEN) if opened else 0
        close = text.find(THINK_CLOSE, body)
        if close >= 0:
            return text[body:close], close + len(THINK_CLOSE)
        if opened or self.unclosed_is_reasoning:
            return text[body:], len(text)
        return None, 0


class DeepSeekR1(ThinkTags):
    """``deepseek_r1``: text without ``</think>`` is reasoning."""

    def __init__(self) -> None:
        super().__init__(unclosed_is_reasoning=True)


class Qwen3(ThinkTags):
    """``qwen3``: text with no think tag is content."""

    def __init__(self) -> None:
        super().__init__(unclosed_is_reasoning=False)
