"""SingleTurn.generate_many keeps a balancing ``engine_for`` balancing: with engines that have no
``generate_many`` (the Ray runtime's proxies) every sample is its own call, so each request is in
flight before the next sample's engine is chosen (choosing every group's engine first sent all of
them to one engine)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from plasmid.builtin import SingleTurn
from plasmid.context import RolloutContext
from plasmid.testing import make_config, run
from plasmid.testing.contracts.generate import ByteTokenizer, prompt_sample
from plasmid.testing.scripted import BatchingScriptedEngine, Reply, ScriptedEngine
from plasmid.types import SamplingParams


@dataclass
class CountingEngine(ScriptedEngine):
    """A scripted engine that counts its requests in flight (each stays out for one loop turn)."""

    in_flight: int = 0

    async def generate(self, prompt_ids, params):
        self.in_flight += 1
        try:
            await asyncio.sleep(0)
            return await super().generate(prompt_ids, params)
        finally:
            self.in_flight -= 1


@dataclass
class LeastLoaded(RolloutContext):
    """Sends a group to the engine with the fewest requests in flight when its first sample asks."""

    chosen: dict[int, int] = field(default_factory=dict)

    def engine_for(self, sample):
        if sample.group_index not in self.chosen:
            loads = [getattr(engine, "in_flight", 0) for engine in self.engines]
            self.chosen[sample.group_index] = loads.index(min(loads))
        return self.engines[self.chosen[sample.group_index]]


def groups_on(engines):
    ctx = LeastLoaded(config=make_config(), engines=engines, data_source=None, tokenizer=ByteTokenizer(),
                      generate=None, rewards=None)
    generate = SingleTurn(ctx.config)
    params = SamplingParams(max_new_tokens=4, stop_token_ids=(2,))

    def group(index):
        return [prompt_sample(f"g{index}", index=index) for _ in range(4)]

    async def scenario():
        return await asyncio.gather(*(generate.generate_many(ctx, samples, [params] * 4)
                                      for samples in (group(0), group(1))))

    return run(scenario()), ctx


def test_groups_spread_over_engines_that_count_requests_in_flight():
    engines = [CountingEngine(lambda ids, params: Reply([70, 2])) for _ in range(2)]
    (first, second), ctx = groups_on(engines)
    assert ctx.chosen == {0: 0, 1: 1}
    assert [len(engine.calls) for engine in engines] == [4, 4]
    assert all(sample.response_length == 2 for sample in [*first, *second])


def test_engines_with_generate_many_get_a_group_in_one_call():
    engines = [BatchingScriptedEngine(lambda ids, params: Reply([70, 2])) for _ in range(2)]
    (first, second), _ = groups_on(engines)
    assert [size for engine in engines for size in engine.batches] == [4, 4], "one call of 4 per group"
    assert all(sample.response_length == 2 for sample in [*first, *second])
