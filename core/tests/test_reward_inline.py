"""Inline rewards (``inline = True``): scored on the caller's thread, no worker; everything else as before."""

import asyncio
import threading

import pytest

from plasmid.rewards import RewardComponent, RewardSet
from plasmid.types import RewardParts, Sample


class Thread:
    """Inline reward that records the thread each call ran on; value 1.0 + the sample's index."""

    inline = True

    def __init__(self):
        self.threads = set()

    async def __call__(self, sample):
        self.threads.add(threading.get_ident())
        return 1.0 + sample.index


class Worker(Thread):
    inline = False


def scored(components, samples, **kwargs):
    rewards = RewardSet(components=components, **kwargs)
    asyncio.run(rewards.score_group(samples))
    return rewards


def test_an_inline_reward_runs_on_the_callers_thread_and_starts_no_worker():
    reward = Thread()
    samples = [Sample(index=i) for i in range(4)]
    rewards = scored([RewardComponent("cheap", 0.5, reward)], samples)
    assert reward.threads == {threading.get_ident()}
    assert rewards._workers.current == {}
    assert [s.reward for s in samples] == [0.5, 1.0, 1.5, 2.0]
    assert [s.reward_components for s in samples] == [{"cheap": 1.0 + i} for i in range(4)]


def test_inline_and_worker_rewards_mix_and_sum_in_component_order():
    inline, worker = Thread(), Worker()
    samples = [Sample(index=i) for i in range(3)]
    rewards = scored([RewardComponent("a", 1.0, inline), RewardComponent("b", 0.1, worker)], samples)
    assert inline.threads == {threading.get_ident()}
    assert worker.threads and threading.get_ident() not in worker.threads
    for s in samples:
        assert s.reward == (1.0 + s.index) + 0.1 * (1.0 + s.index)
        assert list(s.reward_components) == ["a", "b"]
    rewards.close()


def test_inline_and_worker_scoring_give_the_same_floats_and_failures():
    """The same values, sums and failure records either way (the quickstart's metrics stay equal)."""

    class Odd:
        async def __call__(self, sample):
            if sample.index == 2:
                raise ValueError("no label")
            if sample.index == 3:
                return float("nan")
            return RewardParts(0.1 * sample.index, {"len": 3})

    class OddInline(Odd):
        inline = True

    results = []
    for fn in (Odd(), OddInline()):
        samples = [Sample(index=i) for i in range(5)]
        rewards = scored([RewardComponent("r", 0.3, fn), RewardComponent("c", 1.0, Thread())], samples)
        results.append(([(s.reward, s.reward_components, s.metadata) for s in samples], rewards.pop_metrics()))
        rewards.close()
    assert results[0] == results[1]
    assert results[1][1] == {"reward/failed/r: ValueError": 2.0}


def test_an_inline_reward_that_raises_or_exits_fails_only_its_sample():
    class Raises:
        inline = True

        async def __call__(self, sample):
            if sample.index == 1:
                raise SystemExit(3)
            if sample.index == 2:
                raise RuntimeError("verifier crashed")
            return 1.0

    samples = [Sample(index=i) for i in range(3)]
    rewards = scored([RewardComponent("x", 1.0, Raises())], samples)
    assert [s.reward for s in samples] == [1.0, 0.0, 0.0]
    assert samples[1].metadata["reward_errors"] == ["x: SystemExit: 3"]
    assert samples[2].metadata["reward_errors"] == ["x: RuntimeError: verifier crashed"]
    assert rewards.pop_metrics() == {"reward/failed/x: SystemExit": 1.0, "reward/failed/x: RuntimeError": 1.0}


def test_an_inline_reward_that_awaits_fails_its_sample_and_names_the_contract():
    class Awaits:
        inline = True

        async def __call__(self, sample):
            await asyncio.sleep(0)
            return 1.0

    sample = Sample()
    scored([RewardComponent("lazy", 1.0, Awaits())], [sample])
    assert sample.reward == 0.0
    assert "inline = True but awaited" in sample.metadata["reward_errors"][0]


def test_an_inline_group_reward_sees_the_group_and_a_wrong_length_fails_it():
    class Judge:
        inline = True
        group = True

        def __init__(self, extra=0):
            self.extra = extra

        async def __call__(self, samples):
            return tuple(float(i) for i in range(len(samples) + self.extra))

    samples = [Sample(index=i) for i in range(3)]
    scored([RewardComponent("judge", 1.0, Judge())], samples)
    assert [s.reward for s in samples] == [0.0, 1.0, 2.0]
    samples = [Sample(index=i) for i in range(3)]
    rewards = scored([RewardComponent("judge", 1.0, Judge(extra=1))], samples)
    assert all("returned 4 values for 3 samples" in s.metadata["reward_errors"][0] for s in samples)
    assert rewards.pop_metrics() == {"reward/failed/judge: ValueError": 3.0}


def test_inline_must_be_true_not_truthy():
    class Truthy(Worker):
        inline = "yes"

    assert not RewardComponent("t", 1.0, Truthy()).is_inline
    assert RewardComponent("t", 1.0, Thread()).is_inline


@pytest.mark.timeout(60)
def test_a_blocking_worker_reward_next_to_an_inline_one_still_times_out():
    release = threading.Event()

    class Blocks:
        async def __call__(self, sample):
            release.wait(30)
            return 1.0

    sample = Sample()
    try:
        rewards = scored([RewardComponent("cheap", 1.0, Thread()), RewardComponent("stuck", 1.0, Blocks())],
                         [sample], timeout=0.5)
    finally:
        release.set()
    assert sample.reward_components == {"cheap": 1.0, "stuck": 0.0}
    assert sample.metadata["reward_errors"] == ["stuck: timed out"]
    rewards.close()
