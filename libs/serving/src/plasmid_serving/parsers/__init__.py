"""Tool-call and reasoning parsers: a model family's text read as OpenAI's ``content``,
``tool_calls`` and ``reasoning_content``, shared by the agent gateway and ``--generate multiturn``.

- :mod:`~plasmid_serving.parsers.base`: what a parser gives (:class:`ToolCall`, :class:`CallSpan`,
  :class:`ParsedMessage`), the :class:`ToolParser` base and :func:`parse_message`;
- :mod:`~plasmid_serving.parsers.tools`, :mod:`~plasmid_serving.parsers.reasoning` and
  :mod:`~plasmid_serving.parsers.harmony` (gpt-oss): the built-in parsers;
- :mod:`~plasmid_serving.parsers.registry`: the parsers by name, and the entry-point groups
  ``plasmid.tool_parsers`` and ``plasmid.reasoning_parsers`` through which packages add theirs;
- :mod:`~plasmid_serving.parsers.options`: ``--tool-parser`` and ``--reasoning-parser``.

Parsers read text only: the token ids a sample is trained on are the engine's, whatever a parser
makes of their text.
"""

from plasmid_serving.parsers.base import (
    CallSpan,
    ParsedMessage,
    ReasoningParser,
    ToolCall,
    ToolParser,
    call_from_json,
    parse_message,
)
from plasmid_serving.parsers.registry import (
    REASONING_PARSER_GROUP,
    REASONING_PARSERS,
    TOOL_PARSER_GROUP,
    TOOL_PARSERS,
    ParserRegistry,
)

__all__ = ["CallSpan", "ParsedMessage", "ParserRegistry", "REASONING_PARSERS", "REASONING_PARSER_GROUP",
           "ReasoningParser", "TOOL_PARSERS", "TOOL_PARSER_GROUP", "ToolCall", "ToolParser", "call_from_json",
           "parse_message"]
