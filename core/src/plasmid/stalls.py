"""Steps in a row that cannot learn: :class:`Stalls` warns on each and tells the loop
(:mod:`plasmid.loop`) when to stop the run."""

from __future__ import annotations

import sys
from typing import TextIO

from plasmid.config import Config
from plasmid.kernel_options import FaultOptions, ScheduleOptions
from plasmid.protocols import BAD_STEP_PREFIX


class Stalls:
    """Steps in a row that cannot learn, warned about on each and stopped after too many:

    - *bad* steps, which the trainer refused (metrics ``BAD_STEP_PREFIX + reason``, nonzero;
      weights and optimizer untouched): ``--max-bad-steps`` in a row stop the run;
    - *empty* steps, in which filters (or ``--max-staleness``) dropped every group, so nothing
      was trained: ``--max-empty-steps`` in a row stop the run.

    A step that trains normally ends both streaks; an empty step leaves the bad streak as it is.
    """

    def __init__(self, config: Config, trainer_label: str, stream: TextIO | None = None) -> None:
        faults = FaultOptions.of(config)
        self.max_bad, self.max_empty = faults.max_bad_steps, faults.max_empty_steps
        self.trainer_label = trainer_label
        self.filters = list(config.option.filter or [])
        self.max_staleness = ScheduleOptions.of(config).max_staleness
        self.stream = stream or sys.stderr
        self.bad: list[int] = []
        self.empty: list[int] = []

    def observe(self, step: int, metrics: dict[str, float], *, trained: bool) -> str | None:
        """Count step ``step``; the reason to stop the run (one line), or ``None`` to go on."""
        if not trained:
            self.empty.append(step)
            drops = ", ".join(f"{key.removeprefix('rollout/dropped/')} {value:g}" for key, value in
                              sorted(metrics.items()) if key.startswith("rollout/dropped/")) or "none counted"
            self._warn(f"WARNING: step {step}: no group was left to train on (dropped: {drops}) by "
                       f"{self._droppers()}; nothing was trained [{len(self.empty)} of --max-empty-steps "
                       f"{self.max_empty} in a row]")
            if len(self.empty) >= self.max_empty:
                return (f"stopped after {len(self.empty)} steps in a row ({_span(self.empty)}) with no group "
                        f"left to train on: {self._droppers()} dropped every group, so the run cannot learn "
                        f"(loosen them, or raise --max-empty-steps)")
            return None
        self.empty.clear()
        reasons = sorted(key.removeprefix(BAD_STEP_PREFIX) for key, value in metrics.items()
                         if key.startswith(BAD_STEP_PREFIX) and value)
        if not reasons:
            self.bad.clear()
            return None
        self.bad.append(step)
        self._warn(f"warning: step {step}: {self.trainer_label} refused the step, weights unchanged: "
                   f"{', '.join(reasons)} [{len(self.bad)} of --max-bad-steps {self.max_bad} in a row]")
        if len(self.bad) >= self.max_bad:
            return (f"stopped after {len(self.bad)} bad steps in a row ({_span(self.bad)}): {self.trainer_label} "
                    f"refused each, the last for {', '.join(reasons)}; nothing was learned from them (lower "
                    f"--lr, check the rewards for huge values, or raise --max-bad-steps)")
        return None

    def _droppers(self) -> str:
        if self.filters:
            return f"the filters ({', '.join(self.filters)}; --filter)"
        if self.max_staleness is not None:
            return f"--max-staleness {self.max_staleness}"
        return "the rollout (no --filter is set)"

    def _warn(self, text: str) -> None:
        self.stream.write(f"plasmid: {text}\n")
        self.stream.flush()


def _span(steps: list[int]) -> str:
    return f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"
