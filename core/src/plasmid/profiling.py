"""``--profile``: :class:`StepClock`, the breakdown of each step's wall time that the loop
(:mod:`plasmid.loop`) adds to the step's metrics: ``time/step_seconds``, the sum of the
:attr:`StepClock.PARTS` and ``time/overhead_seconds`` (the loop's own work: batch bookkeeping,
observer hooks, the metrics log), and ``time/reward_seconds``, the part of the rollout in which
a group was being scored."""

from __future__ import annotations

import time
from collections.abc import Awaitable
from pathlib import Path


class StepClock:
    """The ``--profile`` breakdown of each step's wall time (see :mod:`plasmid.loop`).

    Windows are contiguous: each :meth:`step` closes the window opened by the previous one (the
    first opens when the clock is made), so a run's ``time/step_seconds`` add up to its wall time
    from the first step's start to the last step's metrics.
    """

    #: the parts of a step's window that are measured, not derived
    PARTS = ("time/rollout_seconds", "time/train_seconds", "time/sync_wall_seconds", "time/eval_seconds",
             "time/checkpoint_seconds")

    def __init__(self, rewards: object | None = None) -> None:
        self.rewards = rewards
        self.opened = time.perf_counter()
        self.checkpoint_seconds = 0.0
        if callable(busy := getattr(rewards, "pop_busy_seconds", None)):
            busy()  # reward time before the first step (start-up checks) is not a step's

    def step(self, metrics: dict[str, float], *, sync_seconds: float, eval_seconds: float) -> dict[str, float]:
        """Close the window: the profile metrics of the step whose ``metrics`` hold its
        ``time/rollout_seconds`` and ``time/train_seconds``; ``sync_seconds`` and ``eval_seconds``
        are the loop's wall time of its weight sync (0 when it made none) and evaluation."""
        now = time.perf_counter()
        found = {"time/sync_wall_seconds": sync_seconds, "time/eval_seconds": eval_seconds,
                 "time/checkpoint_seconds": self.checkpoint_seconds, "time/step_seconds": now - self.opened}
        busy = getattr(self.rewards, "pop_busy_seconds", None)
        found["time/reward_seconds"] = float(busy()) if callable(busy) else 0.0
        measured = sum(metrics.get(name, found.get(name, 0.0)) for name in self.PARTS)
        found["time/overhead_seconds"] = max(0.0, found["time/step_seconds"] - measured)
        self.opened, self.checkpoint_seconds = now, 0.0
        return found

    async def saving(self, save: Awaitable[Path]) -> Path:
        """Await the checkpoint ``save``, its time counted in the next window's ``time/checkpoint_seconds``."""
        began = time.perf_counter()
        try:
            return await save
        finally:
            self.checkpoint_seconds += time.perf_counter() - began
