"""``--generate multiturn`` keeps the generate-function contract of ``plasmid.testing``, in each
tool-call format. ``chat-template`` needs a tokenizer with a chat template, which the contract's byte
tokenizer has not: it runs with a real Hugging Face tokenizer whose template renders tools (the
``chat_tokenizer`` fixture of conftest.py), on prompts rendered by that template as a chat data
source renders them."""

from __future__ import annotations

import plasmid_multiturn.plugin
import pytest

from plasmid.testing.contracts.generate import GenerateContract
from plasmid.types import Sample, Status


class TestTaggedFormat(GenerateContract):
    plugin = plasmid_multiturn.plugin
    provider = "multiturn"
    config_options = {"tool_call_format": "tagged"}


class TestCompactFormat(GenerateContract):
    plugin = plasmid_multiturn.plugin
    provider = "multiturn"
    config_options = {"tool_call_format": "compact"}


class TestMistralFormat(GenerateContract):
    plugin = plasmid_multiturn.plugin
    provider = "multiturn"
    config_options = {"tool_call_format": "mistral", "max_turns": 2}


class TestChatTemplateFormat(GenerateContract):
    plugin = plasmid_multiturn.plugin
    provider = "multiturn"
    config_options = {"tool_call_format": "chat-template"}

    @pytest.fixture(autouse=True)
    def _tokenizer(self, chat_tokenizer):
        self.chat_tokenizer = chat_tokenizer()

    def tokenizer(self):
        return self.chat_tokenizer

    def prompt(self, text, index=0):
        """``text`` as one user message, rendered by the chat template with the generation prompt."""
        rendered = self.chat_tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                           add_generation_prompt=True, tokenize=False)
        return Sample(prompt=text, tokens=self.chat_tokenizer.encode(rendered, add_special_tokens=False),
                      index=index, group_index=index, status=Status.PENDING)
