"""What the user's agent function receives."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class AgentSession:
    """One rollout of the agent: ``await FUNC(session)`` drives a conversation through the gateway
    and returns its reward.

    :ivar base_url: the gateway's OpenAI base URL for this rollout (``http://127.0.0.1:PORT/s/KEY/v1``);
        give it to any OpenAI client (``AsyncOpenAI(base_url=session.base_url, api_key=session.api_key)``).
    :ivar api_key: this rollout's session key; the gateway tells concurrent rollouts apart by it
        (in the URL path or, with a plain ``/v1`` base URL, as the bearer API key).
    :ivar model: the model name the gateway serves (``--agent-model``); any name is accepted.
    :ivar messages: the prompt as chat messages (a string prompt is one user message); a fresh
        copy, the agent may change it.
    :ivar label: the sample's label (the answer, for scoring).
    :ivar metadata: the sample's metadata (a copy).
    :ivar index: the sample's index; ``group_index``: its group's.
    """

    base_url: str
    api_key: str
    model: str
    messages: list[dict[str, Any]]
    label: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)
    index: int = 0
    group_index: int = 0
