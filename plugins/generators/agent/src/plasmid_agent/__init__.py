"""plasmid-agent: an OpenAI-compatible gateway in front of the rollout engines, so that an agent
written for the OpenAI API becomes an RL rollout (``--generate agent --agent MODULE:FUNC``).

See the plugin's README for the token accounting rule. Public pieces: :class:`AgentSession`
(what the user's function receives), :class:`Gateway` (the HTTP server), :func:`build_samples`
(calls to trained samples).
"""

from plasmid_agent.recorder import Call, build_samples
from plasmid_agent.session import AgentSession

__all__ = ["AgentSession", "Call", "build_samples"]
