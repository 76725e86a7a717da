"""From a row's prompt to token ids: :class:`plasmid_torch.prompts.PromptEncoder`, shared with
the ``hf`` data source."""

from __future__ import annotations

from plasmid_torch.prompts import Messages, PromptEncoder

__all__ = ["Messages", "PromptEncoder"]
