"""Least-in-flight engine choice (no Ray needed): a new group goes to the engine with the fewest
requests in flight, and the samples of a group stay on one engine while any of them is out."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("ray")

from plasmid_ray.balance import BalancedRolloutContext

from plasmid import testing
from plasmid.context import RolloutContext
from plasmid.types import GenerationOutput, Sample, Status


class FakeEngine:
    """Answers after ``delay`` seconds; counts requests in flight like the Ray proxies do."""

    def __init__(self, delay: float) -> None:
        self.delay, self.in_flight, self.served = delay, 0, []

    async def generate(self, prompt_ids, params):
        self.in_flight += 1
        try:
            await asyncio.sleep(self.delay)
            self.served.append(prompt_ids[0])
            return GenerationOutput([5], [-0.1], Status.COMPLETED, 0)
        finally:
            self.in_flight -= 1


def context(engines):
    ctx = RolloutContext(config=testing.make_config(), engines=engines, data_source=None, tokenizer=None,
                         generate=None, rewards=None)
    return BalancedRolloutContext.wrap(ctx)


async def run_groups(ctx, groups, size):
    async def one(sample):
        return await ctx.engine_for(sample).generate([sample.group_index], None)

    await asyncio.gather(*(one(Sample(group_index=g)) for g in groups for _ in range(size)))


def test_groups_spread_over_idle_engines_and_keep_together():
    engines = [FakeEngine(0.01), FakeEngine(0.01)]
    ctx = context(engines)
    asyncio.run(run_groups(ctx, range(6), 4))
    assert sorted(engines[0].served) == [0] * 4 + [2] * 4 + [4] * 4
    assert sorted(engines[1].served) == [1] * 4 + [3] * 4 + [5] * 4
    assert ctx._groups == {}, "finished groups must be forgotten"


def test_a_slow_engine_gets_fewer_groups():
    engines = [FakeEngine(0.2), FakeEngine(0.005)]
    ctx = context(engines)

    async def scenario():
        waves = []
        for wave in range(6):            # a group every 20 ms; engine 0 is still busy with its first one
            waves.append(asyncio.ensure_future(run_groups(ctx, [wave], 2)))
            await asyncio.sleep(0.02)
        await asyncio.gather(*waves)

    asyncio.run(scenario())
    assert sorted(set(engines[0].served)) == [0]
    assert sorted(set(engines[1].served)) == [1, 2, 3, 4, 5]


def test_other_engine_methods_pass_through_the_routed_engine():
    engine = FakeEngine(0.0)
    engine.weight_version = 7
    assert context([engine]).engine_for(Sample(group_index=3)).weight_version == 7
