"""Per-turn rewards on samples, and the batch a loss reads them from.

A multi-turn sample (a gym episode, a verifiers trajectory) may carry one reward per model turn in
``sample.metadata[TURN_REWARDS_KEY]``: a list of ``[offset, reward]`` pairs, where ``offset`` is
the position in the sample's response (an index into its ``loss_mask``; 0 is the first response
token) where that turn's model output starts, and ``reward`` the reward the environment gave that
turn. Offsets strictly increase and lie in ``[0, response_length)``; rewards are finite numbers.
A turn spans the tokens from its offset up to the next turn's offset (the masked tool or
environment output between two model turns included, and not trained on); tokens before the first
offset belong to the first turn.

The sample's scalar ``reward`` stays what filters, metrics and the scalar losses see. A loss with
turn credit (plasmid-grpo's ``--turn-credit``) reads the turn rewards and credits the difference
``reward - sum(turn rewards)`` (other reward functions, weights, shaping) to the last turn, so the
turns' rewards always add up to the sample's reward. A sample without the key is one turn at
offset 0 with its scalar reward.

The key and :func:`checked_turn_rewards` import no torch (environment plugins write the key
before any loss is chosen); :func:`with_turns` builds the tensors.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from plasmid.types import LossBatch, Sample

#: ``Sample.metadata`` key of a sample's per-turn rewards: ``[[offset, reward], ...]`` (see the module docstring).
TURN_REWARDS_KEY = "turn_rewards"


def checked_turn_rewards(value: Any, response_length: int, where: str) -> list[tuple[int, float]]:
    """``value`` (a sample's ``metadata[TURN_REWARDS_KEY]``) as ``[(offset, reward), ...]``.

    :param response_length: the sample's response length; every offset must be below it.
    :param where: names the sample in errors.
    :raises ValueError: not a non-empty list of ``[int offset, finite reward]`` pairs with strictly
        increasing offsets in ``[0, response_length)``; the message names ``where`` and the key.
    """
    about = f"{where}: metadata[{TURN_REWARDS_KEY!r}]"
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"{about} must be a non-empty list of [offset, reward] pairs, got {value!r}")
    turns: list[tuple[int, float]] = []
    for pair in value:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise ValueError(f"{about} holds {pair!r}; each turn is an [offset, reward] pair")
        offset, reward = pair
        if isinstance(offset, bool) or not isinstance(offset, numbers.Integral):
            raise ValueError(f"{about} has the offset {offset!r}; an offset is a token position (int)")
        if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(float(reward)):
            raise ValueError(f"{about} has the reward {reward!r} at offset {offset}; a reward is a finite number")
        if not 0 <= int(offset) < response_length:
            raise ValueError(f"{about} has the offset {offset}, outside the response's {response_length} tokens")
        if turns and int(offset) <= turns[-1][0]:
            raise ValueError(f"{about} has the offset {offset} after {turns[-1][0]}; offsets must increase")
        turns.append((int(offset), float(reward)))
    return turns


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
