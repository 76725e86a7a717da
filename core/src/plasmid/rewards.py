"""Combining reward functions: weights, dict-valued rewards, timeouts and failures.

``--reward math --reward format:0.1`` gives ``reward = 1.0 * math + 0.1 * format``; each
component is kept on the sample (``reward_components``) and logged. A reward that raises or
times out marks the sample with the reward's name and reason; with ``--reward-errors zero`` the
sample scores 0 and the run goes on (the first failure of each reward is printed to stderr with
the plugin that provides it; counts go to the ``reward/failed/...`` metrics), with ``fail`` the
run stops with a :class:`ProviderError` naming the plugin.
"""

from __future__ import annotations

import asyncio
import math
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from plasmid.errors import ProviderError
from plasmid.types import Sample


@dataclass
class RewardComponent:
    """One ``--reward NAME:WEIGHT`` entry: the built reward function and who provided it."""

    name: str
    weight: float
    fn: Any
    plugin: str = ""

    @property
    def is_group(self) -> bool:
        return bool(getattr(self.fn, "group", False))


@dataclass
class RewardSet:
    """The run's rewards. ``score_group`` is what rollout drivers call.

    :ivar failures: ``"name: ExceptionType"`` -> count, since the last :meth:`pop_metrics`.
    """

    components: list[RewardComponent]
    reward_key: str | None = None
    timeout: float = 60.0
    errors: str = "zero"
    failures: Counter[str] = field(default_factory=Counter)
    #: rewards whose first failure was already printed (once per reward, not per sample).
    reported: set[str] = field(default_factory=set)

    async def score_group(self, samples: list[Sample]) -> None:
        """Score ``samples`` (one group) in place: ``reward`` and ``reward_components``.

        Per-sample rewards run concurrently with each other; group rewards see all samples.
        """
        per_component = await asyncio.gather(*(self._component_values(c, samples) for c in self.components))
        for position, sample in enumerate(samples):
            total = 0.0
            for component, values in zip(self.components, per_component, strict=True):
                value = values[position]
                sample.reward_components[component.name] = value
                total += component.weight * value
            sample.reward = total

    async def _component_values(self, component: RewardComponent, samples: list[Sample]) -> list[float]:
        if component.is_group:
            try:
                async with asyncio.timeout(self.timeout):
                    raw = await component.fn(samples)
                if len(raw) != len(samples):
                    raise ValueError(f"group reward returned {len(raw)} values for {len(samples)} samples")
                return [self._as_float(component, value) for value in raw]
            except Exception as exc:  # noqa: BLE001 - reported with the plugin's name
                for sample in samples:
                    self._failed(component, sample, exc)
                return [0.0] * len(samples)
        return list(await asyncio.gather(*(self._one(component, sample) for sample in samples)))

    async def _one(self, component: RewardComponent, sample: Sample) -> float:
        try:
            async with asyncio.timeout(self.timeout):      # a timer, not a task per sample (wait_for)
                value = await component.fn(sample)
            return self._as_float(component, value)
        except Exception as exc:  # noqa: BLE001 - reported with the plugin's name
            self._failed(component, sample, exc)
            return 0.0

    def _as_float(self, component: RewardComponent, value: Any) -> float:
        if isinstance(value, dict):
            key = self.reward_key
            if key is None:
                if len(value) != 1:
                    raise ValueError(f"returned a dict with keys {sorted(value)}; choose one with --reward-key")
                key = next(iter(value))
            if key not in value:
                raise ValueError(f"returned a dict without --reward-key {key!r} (keys: {sorted(value)})")
            value = value[key]
        result = float(value)
        if not math.isfinite(result):
            raise ValueError(f"returned a non-finite reward {value!r}")
        return result

    def _failed(self, component: RewardComponent, sample: Sample, exc: BaseException) -> None:
        reason = "timed out" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}"
        where = f"reward '{component.name}'" + (f" from plugin {component.plugin}" if component.plugin else "")
        if self.errors == "fail":
            raise ProviderError(f"{where} failed on sample {sample.index}: {reason}",
                                provider=component.name, plugin=component.plugin) from exc
        sample.metadata.setdefault("reward_errors", []).append(f"{component.name}: {reason}")
        if component.name not in self.reported:
            self.reported.add(component.name)
            print(f"plasmid: {where} failed on sample {sample.index}: {reason}; the sample scores 0 for it and "
                  f"the run goes on (counted in reward/failed/...; --reward-errors fail stops instead)",
                  file=sys.stderr)
        self.failures[f"{component.name}: {type(exc).__name__}" if not isinstance(exc, TimeoutError)
                      else f"{component.name}: timeout"] += 1

    def pop_metrics(self) -> dict[str, float]:
        """Failure counts since the last call, as ``reward/failed/<name: kind>`` metrics."""
        metrics = {f"reward/failed/{key}": float(count) for key, count in self.failures.items()}
        self.failures.clear()
        return metrics
