"""Combining rewards: weights, dict rewards, group rewards, timeouts and failures."""

import asyncio

import pytest

from plasmid.errors import ProviderError
from plasmid.rewards import RewardComponent, RewardSet
from plasmid.types import Sample


class Constant:
    def __init__(self, value):
        self.value = value

    async def __call__(self, sample):
        return self.value


class Raises:
    async def __call__(self, sample):
        raise RuntimeError("verifier crashed")


class Sleeps:
    async def __call__(self, sample):
        await asyncio.sleep(5)
        return 1.0


class Judge:
    group = True

    async def __call__(self, samples):
        return [float(i) for i in range(len(samples))]


def score(components, samples, **kwargs):
    reward_set = RewardSet(components=components, **kwargs)
    asyncio.run(reward_set.score_group(samples))
    return reward_set


def test_weighted_components_are_summed_and_kept():
    sample = Sample(index=3)
    score([RewardComponent("math", 1.0, Constant(1.0)), RewardComponent("format", 0.1, Constant(0.5))], [sample])
    assert sample.reward == pytest.approx(1.05)
    assert sample.reward_components == {"math": 1.0, "format": 0.5}


def test_dict_reward_needs_a_key_when_it_has_several_fields():
    sample = Sample()
    reward_set = score([RewardComponent("rm", 1.0, Constant({"score": 0.7, "len": 3.0}))], [sample])
    assert sample.reward == 0.0 and "choose one with --reward-key" in sample.metadata["reward_errors"][0]
    assert reward_set.pop_metrics() == {"reward/failed/rm: ValueError": 1.0}
    sample = Sample()
    score([RewardComponent("rm", 1.0, Constant({"score": 0.7, "len": 3.0}))], [sample], reward_key="score")
    assert sample.reward == pytest.approx(0.7)


def test_failing_reward_scores_zero_and_names_itself():
    samples = [Sample(index=i) for i in range(3)]
    reward_set = score([RewardComponent("flaky", 1.0, Raises(), "'flaky' (distribution rl-flaky 1.0)"),
                        RewardComponent("ok", 1.0, Constant(1.0))], samples)
    assert [s.reward for s in samples] == [1.0, 1.0, 1.0]
    assert samples[0].metadata["reward_errors"] == ["flaky: RuntimeError: verifier crashed"]
    assert reward_set.pop_metrics() == {"reward/failed/flaky: RuntimeError": 3.0}
    assert reward_set.pop_metrics() == {}


def test_failing_reward_stops_the_run_when_asked():
    with pytest.raises(ProviderError, match="reward 'flaky' from plugin 'flaky'.*verifier crashed"):
        score([RewardComponent("flaky", 1.0, Raises(), "'flaky'")], [Sample()], errors="fail")


def test_slow_reward_times_out():
    sample = Sample()
    reward_set = score([RewardComponent("slow", 1.0, Sleeps())], [sample], timeout=0.05)
    assert sample.reward == 0.0 and sample.metadata["reward_errors"] == ["slow: timed out"]
    assert reward_set.pop_metrics() == {"reward/failed/slow: timeout": 1.0}


def test_non_finite_reward_is_a_failure():
    sample = Sample()
    score([RewardComponent("nan", 1.0, Constant(float("nan")))], [sample])
    assert sample.reward == 0.0 and "non-finite" in sample.metadata["reward_errors"][0]


def test_group_reward_sees_the_whole_group():
    samples = [Sample(index=i) for i in range(4)]
    score([RewardComponent("judge", 2.0, Judge())], samples)
    assert [s.reward for s in samples] == [0.0, 2.0, 4.0, 6.0]


def test_per_sample_rewards_run_concurrently():
    class Slow:
        async def __call__(self, sample):
            await asyncio.sleep(0.2)
            return 1.0

    samples = [Sample(index=i) for i in range(20)]
    loop = asyncio.new_event_loop()
    started = loop.time()
    loop.run_until_complete(RewardSet([RewardComponent("slow", 1.0, Slow())]).score_group(samples))
    elapsed = loop.time() - started
    loop.close()
    assert elapsed < 2.0, "20 rewards of 0.2 s each ran one after another"
