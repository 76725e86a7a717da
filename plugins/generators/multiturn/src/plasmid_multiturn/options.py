"""The options of ``--generate multiturn``, declared once: flags, help, checks and typed values."""

from __future__ import annotations

from typing import Literal

from plasmid.options import Options, option


class MultiTurnOptions(Options, group="multiturn", description="multi-turn rollouts with tool calls (--generate "
                                                               "multiturn)"):
    max_turns: int = option(4, "at most this many model turns per sample; a tool call in the last one is not run "
                               "and the sample is TRUNCATED", min=1)
    max_response_tokens: int | None = option(None, "token budget of a whole response: every model turn and tool "
                                                   "output together; a sample that reaches it is TRUNCATED",
                                             min=1, default_text="--max-turns x --max-new-tokens")
    tool_timeout: float = option(10.0, "seconds one tool call may take; a slower call is reported to the model "
                                       "as timed out (and counted as a tool error)", gt=0)
    tool_max_output_chars: int = option(2000, "a tool answer longer than this many characters is cut to it (the "
                                              "model is told; counted as a tool error)", min=1)
    tool_max_images: int = option(4, "vision-language policies: most images one tool answer may hold (more is a "
                                     "tool error)", min=1)
    tool_max_image_pixels: int = option(4096 * 4096, "vision-language policies: largest image a tool may answer, in "
                                                     "pixels (width x height; larger is a tool error)", min=1,
                                        metavar="PIXELS")
    tool_call_format: Literal["tagged", "chat-template", "compact", "mistral", "harmony"] = option(
        "tagged", "how calls and answers appear: 'tagged' <tool_call>{json}</tool_call> and "
                  "<tool_response>...</tool_response> text; 'chat-template' the tokenizer's chat template with "
                  "tools, rendered turn by turn; 'compact' <call>EXPRESSION</call> calls the calculator, its answer "
                  "appended as <result>...</result> (for tiny models, --task toolcalc); 'mistral' "
                  "[TOOL_CALLS][{json}, ...], several calls per turn, each answer appended as "
                  "[TOOL_RESULTS]{\"content\": ...}[/TOOL_RESULTS]; 'harmony' OpenAI's harmony (gpt-oss): calls "
                  "to=functions.NAME ending in <|call|>, each answer appended as a harmony tool message")

    def budget(self, max_new_tokens: int) -> int:
        """The response token budget: ``--max-response-tokens``, else ``--max-turns`` x ``max_new_tokens``."""
        return self.max_response_tokens or self.max_turns * max_new_tokens
