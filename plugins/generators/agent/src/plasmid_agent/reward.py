"""The ``agent`` reward: what the agent function returned, stored on the sample by ``--generate agent``."""

from __future__ import annotations

from typing import ClassVar

from plasmid.config import Config
from plasmid.kernel_options import RolloutOptions
from plasmid.options import Options
from plasmid.types import RewardParts, Sample
from plasmid_agent.generate import REWARD_KEY, TURNS_KEY


class AgentReward:
    """Reward ``agent`` (the default with ``--generate agent``): ``sample.metadata["agent_reward"]``
    as the agent returned it.

    A float is the reward (an agent that returned one reward per call has the sum of the sample's
    turns stored here: :class:`plasmid_agent.generate.AgentGenerate`). A dict of named floats is a
    :class:`plasmid.types.RewardParts`: its value is the entry ``--reward-key`` names (without it:
    the ``"turn_rewards"`` entry, the sum of the sample's turns, when the agent returned per-call
    rewards in the dict, else the only entry), and every entry is a part, so each key the agent
    returned is logged as ``rollout/reward/agent.<key>``. A dict of several entries and no
    ``"turn_rewards"`` without ``--reward-key``, or without the key it names, is a ``ValueError``
    listing the keys. A sample without a reward was not made by ``--generate agent``:
    a ``ValueError`` that says so."""

    option_classes: ClassVar[tuple[type[Options], ...]] = (RolloutOptions,)

    def __init__(self, config: Config) -> None:
        """Built once per run as ``AgentReward(config)``; reads ``--reward-key``."""
        self.reward_key = RolloutOptions.of(config).reward_key

    async def __call__(self, sample: Sample) -> float | RewardParts:
        if REWARD_KEY not in sample.metadata:
            raise ValueError(f"sample {sample.index} carries no agent reward: reward 'agent' scores the samples "
                             f"that --generate agent made")
        value = sample.metadata[REWARD_KEY]
        if not isinstance(value, dict):
            return float(value)
        parts = {str(key): float(item) for key, item in value.items()}
        key = self.reward_key
        if key is None and TURNS_KEY in parts:
            key = TURNS_KEY
        if key is None:
            if len(parts) != 1:
                raise ValueError(f"sample {sample.index}: the agent returned the keys {sorted(parts)}; choose the "
                                 f"reward among them with --reward-key")
            key = next(iter(parts))
        if key not in parts:
            raise ValueError(f"sample {sample.index}: the agent returned no --reward-key {key!r} (its keys: "
                             f"{sorted(parts)})")
        return RewardParts(parts[key], parts)
