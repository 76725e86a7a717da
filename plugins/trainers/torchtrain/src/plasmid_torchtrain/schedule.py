"""The learning-rate schedule: linear warmup, then constant, linear or cosine decay to ``--min-lr``.

Counted in optimizer updates: a run makes ``--num-rollouts`` x
:func:`plasmid_torch.training.updates_per_rollout` of them.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from plasmid.kernel_options import RolloutOptions
from plasmid_torch.trainer_options import TrainerOptions
from plasmid_torch.training import scheduled_updates

SCHEDULES = ("constant", "linear", "cosine")


def learning_rate(update: int, *, lr: float, schedule: str, warmup_steps: int, total_steps: int,
                  min_lr: float = 0.0) -> float:
    """The learning rate of optimizer update ``update`` (0-based).

    - warmup (``update < warmup_steps``): ``lr * (update + 1) / warmup_steps``, reaching ``lr``
      at the last warmup update;
    - then, with ``progress`` going from 0 to 1 over the remaining ``total_steps - warmup_steps``
      updates: ``constant`` keeps ``lr``; ``linear`` goes ``lr -> min_lr``;
      ``cosine`` is ``min_lr + (lr - min_lr) * (1 + cos(pi * progress)) / 2``. Past
      ``total_steps`` it stays at ``min_lr`` (``lr`` for ``constant``).
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"--lr-schedule {schedule!r}: choose one of {SCHEDULES}")
    if update < warmup_steps:
        return lr * (update + 1) / warmup_steps
    if schedule == "constant":
        return lr
    progress = min(1.0, (update - warmup_steps) / max(1, total_steps - warmup_steps))
    if schedule == "linear":
        return min_lr + (lr - min_lr) * (1.0 - progress)
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


def lr_multiplier(options: TrainerOptions, rollout: RolloutOptions) -> Callable[[int], float]:
    """``update -> learning_rate(update) / --lr`` for ``torch.optim.lr_scheduler.LambdaLR``, over the
    run's :func:`~plasmid_torch.training.scheduled_updates`."""
    base = options.lr
    total = scheduled_updates(options, rollout)

    def multiplier(update: int) -> float:
        return learning_rate(update, lr=base, schedule=options.lr_schedule, warmup_steps=options.lr_warmup_steps,
                             total_steps=total, min_lr=options.min_lr) / base

    return multiplier
