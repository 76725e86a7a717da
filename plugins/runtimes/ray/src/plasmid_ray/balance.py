"""Least-in-flight engine choice: the rollout context of the Ray runtime.

The kernel's :meth:`RolloutContext.engine_for` sends group ``g`` to engine ``g % engines``.
With engines in separate processes a slow or restarting engine would then hold up its share of
every step, so here a group goes to the engine with the fewest requests in flight when its first
sample asks, and the rest of the group follows it (an engine with a prefix cache reuses the
prompt) while any of its requests is still out. Ties go to the lower engine index.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Protocol, runtime_checkable

from plasmid.context import RolloutContext
from plasmid.types import Sample


@runtime_checkable
class CountsInFlight(Protocol):
    """An engine (the Ray runtime's proxy) that counts its ``generate`` calls awaiting an answer."""

    in_flight: int


def in_flight(engine: Any) -> int:
    """Requests ``engine`` has in flight; 0 for an engine that does not count them."""
    return engine.in_flight if isinstance(engine, CountsInFlight) else 0


@dataclass
class BalancedRolloutContext(RolloutContext):
    """A :class:`RolloutContext` whose ``engine_for`` balances by requests in flight.

    Engines count their requests in flight (:class:`CountsInFlight`; the Ray runtime's proxies
    do); ``engine_for`` returns a :class:`RoutedEngine` that counts the group's outstanding requests.
    """

    _groups: dict[int, list[int]] = field(default_factory=dict, repr=False)

    @classmethod
    def wrap(cls, ctx: RolloutContext) -> BalancedRolloutContext:
        return cls(**{f.name: getattr(ctx, f.name) for f in fields(RolloutContext)})

    def engine_for(self, sample: Sample) -> Any:
        group = sample.group_index
        assignment = self._groups.get(group)
        if assignment is None:
            loads = [in_flight(engine) for engine in self.engines]
            assignment = self._groups[group] = [loads.index(min(loads)), 0]
        return RoutedEngine(self, group, self.engines[assignment[0]])

    def _started(self, group: int) -> None:
        self._groups[group][1] += 1

    def _finished(self, group: int) -> None:
        assignment = self._groups.get(group)
        if assignment is not None:
            assignment[1] -= 1
            if assignment[1] <= 0:
                del self._groups[group]


class RoutedEngine:
    """The engine chosen for one group; ``generate`` keeps the group's count of outstanding
    requests, every other attribute is the engine's."""

    def __init__(self, ctx: BalancedRolloutContext, group: int, engine: Any) -> None:
        self._ctx, self._group, self._engine = ctx, group, engine

    async def generate(self, prompt_ids: list[int], params: Any) -> Any:
        self._ctx._started(self._group)
        try:
            return await self._engine.generate(prompt_ids, params)
        finally:
            self._ctx._finished(self._group)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)
