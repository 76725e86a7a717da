"""``--generate multiturn`` keeps the generate-function contract of ``plasmid.testing``, in each
tool-call format that needs no chat template (``chat-template`` needs a tokenizer that has one, which
the contract's byte tokenizer does not; it is tested in test_multiturn_chat_template.py)."""

from __future__ import annotations

import plasmid_multiturn.plugin

from plasmid.testing.contracts.generate import GenerateContract


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
