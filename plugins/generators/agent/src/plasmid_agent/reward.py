"""The ``agent`` reward: what the agent function returned, stored on the sample by ``--generate agent``."""

from __future__ import annotations

from typing import ClassVar

from plasmid.config import Config
from plasmid.options import Options
from plasmid.types import Sample
from plasmid_agent.generate import REWARD_KEY


class AgentReward:
    """Reward ``agent`` (the default with ``--generate agent``): ``sample.metadata["agent_reward"]``,
    a float or a dict of named floats (pick one with ``--reward-key``) as the agent returned it.
    A sample without one was not made by ``--generate agent``: a ``ValueError`` that says so."""

    option_classes: ClassVar[tuple[type[Options], ...]] = ()

    def __init__(self, config: Config) -> None:
        """Built once per run as ``AgentReward(config)``; keeps no state."""

    async def __call__(self, sample: Sample) -> float | dict[str, float]:
        if REWARD_KEY not in sample.metadata:
            raise ValueError(f"sample {sample.index} carries no agent reward: reward 'agent' scores the samples "
                             f"that --generate agent made")
        value = sample.metadata[REWARD_KEY]
        return dict(value) if isinstance(value, dict) else float(value)
