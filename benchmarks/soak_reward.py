"""A local plasmid plugin for ``benchmarks/soak.py`` (soak support, not a shipped reward).

Provides the reward ``soak-exact``: the exact-match rule of the quickstart (a response equal to
the label, whitespace stripped, scores 1.0), with faults injected at random into its calls:

- with probability ``SOAK_RAISE_P`` the call raises ``RuntimeError``;
- with probability ``SOAK_HANG_P`` it blocks its event loop with ``time.sleep(SOAK_HANG_SECONDS)``
  inside the ``async def`` (the worst kind of hang: nothing on that loop can run meanwhile).

Each injected fault is appended to ``SOAK_FAULT_LOG`` as one JSON line ``{"kind", "pid", "time"}``,
so the soak can tell what it injected from what plasmid reported. Used as
``--plugins ./benchmarks/soak_reward.py --reward soak-exact``.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from typing import Any

from plasmid import hookimpl
from plasmid.types import Sample


class FlakyExact:
    """Exact match with injected faults (see the module docstring); stateless but for its RNG."""

    name = "soak-exact"

    def __init__(self, config: Any) -> None:
        self.raise_p = float(os.environ.get("SOAK_RAISE_P", "0"))
        self.hang_p = float(os.environ.get("SOAK_HANG_P", "0"))
        self.hang_seconds = float(os.environ.get("SOAK_HANG_SECONDS", "3"))
        self.log = os.environ.get("SOAK_FAULT_LOG")
        self.rng = random.Random(os.getpid() ^ int(time.time()))

    def _record(self, kind: str) -> None:
        if self.log:
            with open(self.log, "a") as handle:
                handle.write(json.dumps({"kind": kind, "pid": os.getpid(), "time": time.time()}) + "\n")

    async def __call__(self, sample: Sample) -> float:
        draw = self.rng.random()
        if draw < self.raise_p:
            self._record("reward-raise")
            raise RuntimeError("soak: injected reward failure")
        if draw < self.raise_p + self.hang_p:
            self._record("reward-hang")
            time.sleep(self.hang_seconds)  # blocks the loop on purpose: the fault under test
        label = sample.label
        answers = label if isinstance(label, (list, tuple)) else [label]
        return 1.0 if any(sample.response.strip() == str(answer).strip() for answer in answers) else 0.0


@hookimpl
def plasmid_rewards(register: Callable[..., None]) -> None:
    register("soak-exact", FlakyExact)
