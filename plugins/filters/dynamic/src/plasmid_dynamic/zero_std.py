"""The ``zero-std`` filter: drop groups whose rewards are all equal."""

from __future__ import annotations

import math
from typing import ClassVar

from plasmid.config import Config
from plasmid.options import Options
from plasmid.types import Group, Verdict
from plasmid_dynamic.options import ZeroStdOptions

#: The reason of a dropped group, as counted in the rollout metrics.
REASON = "zero_std"


class ZeroStdFilter:
    """Keeps a group only if its rewards differ: drops it (reason ``"zero_std"``) when the
    highest and lowest ``sample.reward`` differ by at most ``--zero-std-tolerance`` (1e-8).

    A group of one sample has nothing to compare with and is dropped too; an empty group is
    dropped with reason ``"empty_group"``. Called by the rollout driver after the rewards ran,
    so every sample has a reward; an unscored sample is an error.
    """

    option_classes: ClassVar[tuple[type[Options], ...]] = (ZeroStdOptions,)

    def __init__(self, config: Config) -> None:
        self.tolerance = ZeroStdOptions.of(config).zero_std_tolerance

    def __call__(self, group: Group) -> Verdict:
        if not group.samples:
            return Verdict(False, "empty_group")
        rewards = [sample.reward for sample in group.samples]
        if any(reward is None or not math.isfinite(reward) for reward in rewards):
            raise ValueError(
                f"filter 'zero-std' (plasmid-dynamic) got group {group.index} with rewards {rewards}: every sample "
                f"needs a finite reward; filters run after the rewards"
            )
        if max(rewards) - min(rewards) <= self.tolerance:
            return Verdict(False, REASON)
        return Verdict(True)
