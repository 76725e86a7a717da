"""Rollout batches made up for tests and benchmarks (test support; imports no pytest, so the
benchmarks' env can use it)."""

from __future__ import annotations

import random

from plasmid.types import Group, RolloutBatch, Sample, Status
from plasmid_torch.tiny import BOS_ID, SPECIAL_TOKENS


def make_rollout_batch(vocab_size: int, *, groups: int = 2, group_size: int = 4, seed: int = 0,
                       rollout_id: int = 0) -> RolloutBatch:
    """A scored :class:`RolloutBatch` of random prompts and responses drawn from ``vocab_size``.

    Rewards alternate 1, 0 within each group (every group has advantages); responses have
    different lengths, and every third one has a masked tool-output token. ``rollout_logprobs``
    are left unset: fill them from an engine or trainer when a test needs them.
    """
    rng = random.Random(seed)
    first_regular = len(SPECIAL_TOKENS)
    made = []
    for group_index in range(groups):
        prompt = [BOS_ID] + [rng.randrange(first_regular, vocab_size) for _ in range(rng.randint(2, 5))]
        samples = []
        for k in range(group_size):
            response = [rng.randrange(first_regular, vocab_size) for _ in range(rng.randint(2, 6))]
            loss_mask = [1] * len(response)
            if (group_index * group_size + k) % 3 == 1:
                loss_mask[1] = 0
            samples.append(Sample(prompt="", tokens=prompt + response, response_length=len(response),
                                  loss_mask=loss_mask, reward=float((k + 1) % 2), status=Status.COMPLETED,
                                  index=group_index * group_size + k, group_index=group_index, weight_version=0))
        made.append(Group(samples=samples, index=group_index))
    return RolloutBatch(rollout_id=rollout_id, groups=made)


__all__ = ["make_rollout_batch"]
