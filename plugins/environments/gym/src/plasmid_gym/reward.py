"""The ``gym`` reward: the episode return ``--generate gym`` computed for the sample."""

from __future__ import annotations

from typing import ClassVar

from plasmid.config import Config
from plasmid.options import Options
from plasmid.types import Sample
from plasmid_gym.generate import RETURN_KEY


class GymReward:
    """Reward ``gym``: ``sample.metadata["gym_return"]`` (its player's summed or discounted rewards).
    A sample without one was not made by ``--generate gym``: a ``ValueError`` that says so."""

    option_classes: ClassVar[tuple[type[Options], ...]] = ()

    def __init__(self, config: Config) -> None:
        """Keeps no state."""

    async def __call__(self, sample: Sample) -> float:
        if RETURN_KEY not in sample.metadata:
            raise ValueError(f"sample {sample.index} carries no episode return: reward 'gym' scores the samples "
                             f"that --generate gym made")
        return float(sample.metadata[RETURN_KEY])
