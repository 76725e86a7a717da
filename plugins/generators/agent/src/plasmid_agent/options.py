"""The options of plasmid-agent, declared once: flags, help, checks and typed values."""

from __future__ import annotations

from typing import Literal

from plasmid.errors import UsageError
from plasmid.options import Options, option


class AgentOptions(Options, group="agent", description="the agent gateway (--generate agent)"):
    agent: str | None = option(None, "the agent: MODULE:FUNC or ./file.py:FUNC, an `async def FUNC(session)` "
                                     "that drives the conversation through the gateway and returns the reward "
                                     "(a float; a list of one float per model call, which become the samples' "
                                     "per-turn rewards; or a dict of named floats, whose 'turn_rewards' entry may "
                                     "be such a list)", metavar="MODULE:FUNC")
    agent_concurrency: int = option(64, "at most this many agents run at once", min=1)
    agent_timeout: float = option(600.0, "seconds one agent may run before its rollout fails", gt=0)
    agent_model: str = option("plasmid", "the model name the gateway serves (session.model)")
    agent_errors: Literal["raise", "zero"] = option(
        "raise", "an agent that raises, times out, returns no valid reward or makes no model call: 'raise' stops "
                 "the run with the error; 'zero' gives its samples reward 0, counts it in "
                 "rollout/agent/errors_fraction and goes on (the first failure is printed once)")

    agent_max_calls: int | None = option(
        None, "model calls one agent session may make through the gateway; a request past it is answered 429 "
              "(OpenAI clients do not retry it), the session's samples so far are kept, and an agent that then "
              "fails gets reward 0 whatever --agent-errors says (counted in rollout/agent/max_calls_fraction)",
        min=1, metavar="N", default_text="no cap")

    agent_max_body: int = option(
        1 << 20, "largest request body the gateway reads, in bytes (a longer one is answered 413 unread: a "
                 "2,000,000-character message is refused, not tokenized)", min=1024, metavar="BYTES")
    agent_max_header_bytes: int = option(64 << 10, "largest request head (request line and headers) the "
                                                   "gateway reads, in bytes (431 beyond)", min=1024,
                                         metavar="BYTES")
    agent_max_headers: int = option(100, "most header fields in one request to the gateway (431 beyond)", min=1)
    agent_idle_timeout: float = option(60.0, "seconds the gateway keeps an idle connection open, and waits for a "
                                             "request's head or the next piece of its body (408)", gt=0)

    agent_max_images: int = option(8, "vision-language policies: most images one chat request may hold, all its "
                                      "messages together (400 beyond)", min=1)
    agent_max_image_pixels: int = option(
        4096 * 4096, "vision-language policies: largest image the gateway reads, in pixels (width x height; 400 "
                     "beyond, checked from the image's header before it is decoded)", min=1, metavar="PIXELS")
    agent_image_paths: bool = option(
        False, "vision-language policies: read image_url parts that are file:// URLs or absolute local paths "
               "(else only data: URLs are read and a path is a 400; http(s) URLs are always refused)")

    def check(self) -> None:
        if self.agent is not None and ":" not in self.agent:
            raise UsageError(f"--agent {self.agent!r}: give MODULE:FUNC or ./file.py:FUNC")
