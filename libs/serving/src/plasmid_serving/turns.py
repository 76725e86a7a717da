"""Per-turn rewards on a sample, as JSON: the metadata key and its checker (no torch).

A multi-turn sample (an agent session, a gym episode, a verifiers trajectory) may carry one reward
per model turn in ``sample.metadata[TURN_REWARDS_KEY]``: a list of ``[offset, reward]`` pairs, where
``offset`` is the position in the sample's response (an index into its ``loss_mask``; 0 is the
first response token) where that turn's model output starts, and ``reward`` the reward that turn
earned. Offsets strictly increase and lie in ``[0, response_length)``; rewards are finite numbers.
A turn spans the tokens from its offset up to the next turn's offset (the masked tool or
environment output between two model turns included); tokens before the first offset belong to
the first turn.

This module is what writers of the key import (plasmid-agent, which installs no torch, and the
environment adapters); :mod:`plasmid_torch.turns` re-exports both names and turns the pairs into
the tensors a loss with turn credit reads.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

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


__all__ = ["TURN_REWARDS_KEY", "checked_turn_rewards"]
