"""``--generate agent`` keeps the generate-function contract of ``plasmid.testing``: the agent
(``agents.py:complete_the_prompt``, the real ``openai`` client) completes the prompt's text through
the gateway's ``/v1/completions``, as the contract's byte tokenizer has no chat template."""

from __future__ import annotations

from pathlib import Path

import plasmid_agent.plugin

from plasmid.testing.contracts.generate import GenerateContract

AGENTS = Path(__file__).parent / "agents.py"


class TestAgentGenerateContract(GenerateContract):
    plugin = plasmid_agent.plugin
    provider = "agent"
    config_options = {"agent": f"{AGENTS}:complete_the_prompt"}
