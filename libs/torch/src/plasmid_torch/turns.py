"""The batch a loss with turn credit reads: a sample's per-turn rewards as tensors.

A sample's per-turn rewards are ``sample.metadata[TURN_REWARDS_KEY]``, ``[[offset, reward], ...]``
(the key and its checker live in :mod:`plasmid_serving.turns`, which imports no torch, so that
plasmid-agent and the environment adapters write them without torch; both names are re-exported
here). A turn spans the tokens from its offset up to the next turn's offset; tokens before the
first offset belong to the first turn.

The sample's scalar ``reward`` stays what filters, metrics and the scalar losses see. A loss with
turn credit (plasmid-grpo's ``--turn-credit``) reads the turn rewards and credits the difference
``reward - sum(turn rewards)`` (other reward functions, weights, shaping) to the last turn, so the
turns' rewards always add up to the sample's reward. A sample without the key is one turn at
offset 0 with its scalar reward. :func:`with_turns` builds the tensors.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from plasmid.types import LossBatch, Sample
from plasmid_serving.turns import TURN_REWARDS_KEY, checked_turn_rewards


@dataclass
class TurnLossBatch(LossBatch):
    """A :class:`plasmid.types.LossBatch` with the samples' turns, for a loss with turn credit.

    :ivar turn_index: ``[B, T]`` int64: the turn (0, 1, ...) each response token belongs to.
    :ivar turn_rewards: ``[B, K]`` float32: each sample's turn rewards, ``K`` the most turns of a
        sample in the batch; ``nan`` past a sample's last turn.
    """

    turn_index: Any = None
    turn_rewards: Any = None

    def select(self, index: Any) -> TurnLossBatch:
        """The rows ``index`` of every tensor (turns included); totals are kept."""
        picked = {name: (value[index] if value is not None and hasattr(value, "shape") else value)
                  for name, value in self.__dict__.items()}
        return TurnLossBatch(**picked)


def sample_turns(sample: Sample) -> list[tuple[int, float]] | None:
    """The checked turns of ``sample``, or ``None`` when it carries none."""
    if TURN_REWARDS_KEY not in sample.metadata:
        return None
    return checked_turn_rewards(sample.metadata[TURN_REWARDS_KEY], sample.response_length,
                                f"sample {sample.index}")


def with_turns(batch: LossBatch, samples: Sequence[Sample], width: int) -> TurnLossBatch:
    """``batch`` (of ``samples``, responses padded to ``width``) with their turns, on the device of
    ``batch.response_mask``. A sample without turn rewards is one turn at offset 0 with its reward.
    Bad turn rewards are a ``ValueError`` naming the sample (:func:`checked_turn_rewards`)."""
    import torch

    per_sample = [sample_turns(sample) or [(0, float(sample.reward or 0.0))] for sample in samples]
    most = max(len(turns) for turns in per_sample)
    turn_index = torch.zeros((len(samples), width), dtype=torch.long)
    turn_rewards = torch.full((len(samples), most), math.nan, dtype=torch.float32)
    positions = torch.arange(width)
    for row, turns in enumerate(per_sample):
        offsets = torch.tensor([offset for offset, _ in turns])
        turn_index[row] = (torch.bucketize(positions, offsets, right=True) - 1).clamp(min=0)
        turn_rewards[row, :len(turns)] = torch.tensor([reward for _, reward in turns])
    device = batch.response_mask.device
    fields = {name: getattr(batch, name) for name in batch.__dataclass_fields__}
    return TurnLossBatch(**fields, turn_index=turn_index.to(device), turn_rewards=turn_rewards.to(device))


__all__ = ["TURN_REWARDS_KEY", "TurnLossBatch", "checked_turn_rewards", "sample_turns", "with_turns"]
