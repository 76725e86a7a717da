"""``--tool-parser`` and ``--reasoning-parser``, declared once for every plugin that reads a model's
calls or reasoning (the agent gateway, ``--generate multiturn``): each adds :class:`ParserOptions`
in its ``plasmid_addoption`` (declaring one class twice does nothing)."""

from __future__ import annotations

from typing import Any

from plasmid.options import Options, option
from plasmid_serving.parsers.registry import REASONING_PARSERS, TOOL_PARSERS


class ParserOptions(Options, group="parsers", description="how a model's tool calls and reasoning are read from "
                                                          "its text (the agent gateway, --generate multiturn)"):
    tool_parser: str | None = option(
        None, "the model family's tool-call syntax, by vLLM's --tool-call-parser name: hermes (SGLang's qwen25), "
              "llama3_json (llama3), mistral, deepseek_v3 (deepseekv3), qwen3_coder, pythonic, openai (gpt-oss's "
              "harmony; SGLang's gpt-oss), or one a package registers (entry-point group plasmid.tool_parsers); "
              "unset: the agent gateway reads hermes, multiturn its --tool-call-format's own syntax", metavar="NAME")
    reasoning_parser: str | None = option(
        None, "split the model's reasoning (<think>, or harmony's analysis channel) from its answer, by vLLM's and "
              "SGLang's --reasoning-parser name: deepseek_r1 (deepseek-r1), qwen3, openai_gptoss (gpt-oss), or one a "
              "package registers (entry-point group plasmid.reasoning_parsers); the gateway returns it as "
              "reasoning_content, and no call inside it is run",
        metavar="NAME")

    def check(self) -> None:
        """An unknown or broken parser name stops the run at start-up, naming the flag."""
        self.tool()
        self.reasoning()

    def tool(self) -> Any:
        """The ``--tool-parser`` parser, or ``None`` when unset."""
        return None if self.tool_parser is None else TOOL_PARSERS.get(self.tool_parser)

    def reasoning(self) -> Any:
        """The ``--reasoning-parser`` parser, or ``None`` when unset."""
        return None if self.reasoning_parser is None else REASONING_PARSERS.get(self.reasoning_parser)
