"""Combining rewards: weights, dict rewards, group rewards, timeouts and failures."""

import asyncio
import math
import struct
import threading
import time

import pytest

from plasmid.errors import ProviderError
from plasmid.reward_workers import STALL_SECONDS
from plasmid.rewards import FLOAT32_MAX, RewardComponent, RewardSet
from plasmid.types import RewardParts, Sample


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


# --------------------------------------------------------------------------- rewards that block their loop


class Blocks:
    """Blocks its event loop (``time.sleep`` in ``async def``) on the samples in ``stuck`` until released."""

    def __init__(self, stuck=(0,)):
        self.stuck = set(stuck)
        self.release = threading.Event()

    async def __call__(self, sample):
        if sample.index in self.stuck:
            self.release.wait(30)
        return 1.0


@pytest.fixture
def blocks():
    reward = Blocks()
    yield reward
    reward.release.set()


@pytest.mark.timeout(60)
def test_a_reward_that_blocks_its_loop_times_out_and_the_callers_loop_runs_on(blocks):
    ticks = 0

    async def main():
        nonlocal ticks

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.ensure_future(ticker())
        rewards = RewardSet([RewardComponent("stuck", 1.0, blocks, "'stuck' (local)"),
                             RewardComponent("ok", 0.5, Constant(1.0))], timeout=0.3)
        sample = Sample(index=0)
        started = time.monotonic()
        await rewards.score_group([sample])
        elapsed = time.monotonic() - started
        task.cancel()
        return rewards, sample, elapsed

    rewards, sample, elapsed = asyncio.run(main())
    assert elapsed < 2.0, f"a blocked reward held score_group for {elapsed:.1f}s despite the 0.3 s timeout"
    assert ticks > 5, "the caller's event loop was blocked by the reward"
    assert sample.reward == 0.5 and sample.reward_components == {"stuck": 0.0, "ok": 1.0}
    assert sample.metadata["reward_errors"] == ["stuck: timed out"]
    assert rewards.pop_metrics()["reward/failed/stuck: timeout"] == 1.0
    rewards.close()


@pytest.mark.timeout(60)
def test_a_cpu_bound_verifier_cannot_outlast_the_timeout():
    class Spins:
        async def __call__(self, sample):
            end = time.monotonic() + 3.0
            while time.monotonic() < end:
                pass
            return 1.0

    started = time.monotonic()
    sample = Sample()
    rewards = score([RewardComponent("spin", 1.0, Spins())], [sample], timeout=0.2)
    assert time.monotonic() - started < 2.5
    assert sample.metadata["reward_errors"] == ["spin: timed out"]
    rewards.close()


@pytest.mark.timeout(60)
def test_a_stuck_worker_is_abandoned_and_later_calls_do_not_queue_behind_it(blocks):
    async def main():
        rewards = RewardSet([RewardComponent("stuck", 1.0, blocks)], timeout=0.3)
        first = Sample(index=0)
        await rewards.score_group([first])          # blocks the worker, times out
        await asyncio.sleep(STALL_SECONDS)
        later = [Sample(index=i) for i in range(1, 9)]
        started = time.monotonic()
        await rewards.score_group(later)            # served by a fresh worker
        return rewards, first, later, time.monotonic() - started

    rewards, first, later, elapsed = asyncio.run(main())
    assert first.metadata["reward_errors"] == ["stuck: timed out"]
    assert [s.reward for s in later] == [1.0] * 8 and elapsed < 0.3
    assert rewards.pop_metrics() == {"reward/failed/stuck: timeout": 1.0, "reward/workers_abandoned": 1.0}
    assert rewards.pop_metrics() == {}
    rewards.close()


@pytest.mark.timeout(60)
def test_one_stuck_sample_costs_only_itself_not_its_group_or_the_groups_queued_behind_it(blocks):
    """A step's groups are all sent at once; a sample whose verifier never returns blocks the
    worker's loop, and the samples not yet started there (its group-mates, the other groups)
    move to a fresh worker and score normally; only the stuck sample times out."""
    blocks.stuck = {3}

    async def main():
        rewards = RewardSet([RewardComponent("stuck", 1.0, blocks)], timeout=2.0)
        groups = [[Sample(index=8 * g + i) for i in range(8)] for g in range(8)]
        started = time.monotonic()
        await asyncio.gather(*(rewards.score_group(group) for group in groups))
        return rewards, [s for group in groups for s in group], time.monotonic() - started

    rewards, samples, elapsed = asyncio.run(main())
    assert [s.index for s in samples if s.reward != 1.0] == [3]
    assert samples[3].metadata["reward_errors"] == ["stuck: timed out"]
    metrics = rewards.pop_metrics()
    assert metrics["reward/failed/stuck: timeout"] == 1.0 and metrics["reward/workers_abandoned"] == 1.0
    assert elapsed < 4.0
    rewards.close()


@pytest.mark.timeout(60)
def test_stuck_workers_are_bounded(blocks, monkeypatch):
    import plasmid.reward_workers

    monkeypatch.setattr(plasmid.reward_workers, "MAX_ABANDONED_WORKERS", 4)  # the bound's value is not the point
    cap = plasmid.reward_workers.MAX_ABANDONED_WORKERS
    blocks.stuck = set(range(100))

    async def main():
        rewards = RewardSet([RewardComponent("stuck", 1.0, blocks)], timeout=0.05)
        for index in range(cap + 3):
            await rewards.score_group([Sample(index=index)])
            await asyncio.sleep(STALL_SECONDS)
        return rewards

    def workers():
        return {t for t in threading.enumerate() if t.name == "plasmid-reward-stuck"}

    before = workers()
    rewards = asyncio.run(main())
    assert rewards.pop_metrics()["reward/workers_abandoned"] == cap
    assert len(workers() - before) == cap + 1  # the abandoned ones and the current one
    rewards.close()


def test_many_samples_are_scored_concurrently_on_the_reward_loop():
    class Naps:
        async def __call__(self, sample):
            await asyncio.sleep(0.05)
            return 1.0

    async def main():
        rewards = RewardSet([RewardComponent("nap", 1.0, Naps())])
        await rewards.score_group([Sample()])       # start the worker
        started = time.monotonic()
        await rewards.score_group([Sample(index=i) for i in range(64)])
        one_group = time.monotonic() - started
        started = time.monotonic()
        await asyncio.gather(*(rewards.score_group([Sample(index=i)]) for i in range(64)))
        rewards.close()
        return one_group, time.monotonic() - started

    one_group, many_groups = asyncio.run(main())
    assert one_group < 1.0 and many_groups < 1.0, (one_group, many_groups)  # one after another: 3.2 s


def test_a_reward_that_exits_is_a_failure_not_the_end_of_the_process():
    class Exits:
        async def __call__(self, sample):
            raise SystemExit(3)

    sample = Sample()
    rewards = score([RewardComponent("exits", 1.0, Exits())], [sample])
    assert sample.metadata["reward_errors"] == ["exits: SystemExit: 3"]
    rewards.close()


def test_cancelling_the_caller_cancels_the_reward():
    cancelled = threading.Event()

    class Waits:
        async def __call__(self, sample):
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.set()
                raise
            return 1.0

    async def main():
        rewards = RewardSet([RewardComponent("waits", 1.0, Waits())])
        task = asyncio.ensure_future(rewards.score_group([Sample()]))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return rewards

    rewards = asyncio.run(main())
    assert cancelled.wait(5)
    rewards.close()


def test_loop_bound_state_of_a_reward_lives_on_its_worker_loop():
    class PerLoop:
        """Like the remote reward and the code sandbox: state per running loop."""

        def __init__(self):
            self.loops = set()
            self.lock = None

        async def __call__(self, sample):
            self.loops.add(asyncio.get_running_loop())
            if self.lock is None:
                self.lock = asyncio.Lock()
            async with self.lock:
                await asyncio.sleep(0)
            return 1.0

    reward = PerLoop()

    async def main():
        rewards = RewardSet([RewardComponent("per-loop", 1.0, reward)])
        for _ in range(3):
            await rewards.score_group([Sample(index=i) for i in range(4)])
        assert asyncio.get_running_loop() not in reward.loops
        return rewards

    rewards = asyncio.run(main())
    assert len(reward.loops) == 1 and rewards.pop_metrics() == {}
    rewards.close()


def test_close_stops_the_worker_threads():
    def workers():
        return {t for t in threading.enumerate() if t.name in ("plasmid-reward-a", "plasmid-reward-b")}

    before = workers()
    rewards = score([RewardComponent("a", 1.0, Constant(1.0)), RewardComponent("b", 1.0, Constant(1.0))],
                    [Sample()])
    started = workers() - before
    assert len(started) == 2, "one worker thread per reward"
    rewards.close()
    for thread in started:
        thread.join(5)
        assert not thread.is_alive()


# --------------------------------------------------------------------------- float32 range


def test_a_reward_above_float32_range_fails_naming_the_reward():
    sample = Sample(index=4)
    rewards = score([RewardComponent("huge", 1.0, Constant(1e39), "'huge' (local)"),
                     RewardComponent("ok", 1.0, Constant(1.0))], [sample])
    assert sample.reward == 1.0 and sample.reward_components == {"huge": 0.0, "ok": 1.0}
    assert "huge: ValueError: returned 1e+39, outside float32 range" in sample.metadata["reward_errors"][0]
    assert rewards.pop_metrics() == {"reward/failed/huge: ValueError": 1.0}
    with pytest.raises(ProviderError, match=r"reward 'huge' from plugin 'huge' \(local\) failed on sample 4: "
                                            r"ValueError: returned -1e\+39, outside float32 range"):
        score([RewardComponent("huge", 1.0, Constant({"score": -1e39}), "'huge' (local)")], [Sample(index=4)],
              errors="fail")


def test_float32_max_is_the_largest_finite_float32():
    assert struct.unpack("<f", struct.pack("<f", FLOAT32_MAX))[0] == FLOAT32_MAX
    with pytest.raises(OverflowError):
        struct.pack("<f", math.nextafter(FLOAT32_MAX, math.inf) * 1.0000001)


def test_a_weighted_reward_that_overflows_fails_and_the_total_stays_in_float32():
    sample = Sample()
    score([RewardComponent("big", 10.0, Constant(1e308), "'big' (local)"),
           RewardComponent("ok", 1.0, Constant(0.5))], [sample])
    assert sample.reward == 0.5 and sample.reward_components["big"] == 0.0
    assert sample.metadata["reward_errors"] == ["big: ValueError: returned 1e+308, outside float32 range "
                                                "(|reward| <= 3.402823e+38)"]
    sample = Sample()
    score([RewardComponent("big", 10.0, Constant(1e38), "'big' (local)")], [sample])
    assert sample.reward == 0.0 and sample.metadata["reward_errors"] == [
        "big: ValueError: returned 1e+38, which weighted by 10 is 1e+39, outside float32 range"]

    sample = Sample()
    score([RewardComponent("a", 1.0, Constant(3e38)), RewardComponent("b", 1.0, Constant(3e38)),
           RewardComponent("c", -1.0, Constant(1e38))], [sample])
    assert sample.reward == pytest.approx(2e38) and sample.reward_components == {"a": 3e38, "b": 0.0, "c": 1e38}
    assert sample.metadata["reward_errors"][0].startswith("b: ValueError: returned 3e+38: the weighted sum")
    assert struct.pack("<f", sample.reward)  # representable


# --------------------------------------------------------------------------- every reward failing


def test_every_reward_failing_in_a_step_is_warned_about_and_stops_the_run_after_three_steps(capsys):
    rewards = RewardSet([RewardComponent("flaky", 1.0, Raises(), "'flaky' (local)"),
                         RewardComponent("huge", 0.5, Constant(1e39), "'huge' (local)")])

    def step():
        asyncio.run(rewards.score_group([Sample(index=i) for i in range(4)]))
        return rewards.pop_metrics()

    assert step()["reward/failed/flaky: RuntimeError"] == 4.0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warnings == [
        "plasmid: warning: every reward failed on all 4 samples scored (reward 'flaky' from plugin "
        "'flaky' (local), reward 'huge' from plugin 'huge' (local)), so every reward is 0 and nothing can be "
        "learned; first failure: reward 'flaky' from plugin 'flaky' (local) on sample 0: RuntimeError: "
        "verifier crashed (1 step(s) in a row; 3 stop the run)"]
    step()
    with pytest.raises(ProviderError, match=r"every reward failed on all 4 samples .* stopping after 3 such steps"):
        step()
    rewards.close()


def test_a_step_with_one_working_reward_resets_the_count(capsys):
    failing = RewardSet([RewardComponent("flaky", 1.0, Raises())], max_all_failed_steps=2)
    asyncio.run(failing.score_group([Sample()]))
    failing.pop_metrics()
    assert failing.pop_metrics() == {}     # nothing scored: neither counts nor resets
    failing.components.append(RewardComponent("ok", 1.0, Constant(1.0)))
    asyncio.run(failing.score_group([Sample(), Sample()]))
    failing.pop_metrics()                  # one reward worked: the count starts again
    failing.components.pop()
    asyncio.run(failing.score_group([Sample()]))
    failing.pop_metrics()
    assert capsys.readouterr().err.count("plasmid: warning: every reward failed") == 2
    asyncio.run(failing.score_group([Sample()]))
    with pytest.raises(ProviderError):
        failing.pop_metrics()
    failing.close()


def test_a_group_reward_may_return_any_sequence_of_the_right_length():
    class Tuple:
        group = True

        async def __call__(self, samples):
            return tuple(float(i) for i in range(len(samples)))

    class Short:
        group = True

        async def __call__(self, samples):
            return [1.0]

    samples = [Sample(index=i) for i in range(3)]
    score([RewardComponent("tuple", 1.0, Tuple()), RewardComponent("short", 1.0, Short())], samples)
    assert [s.reward for s in samples] == [0.0, 1.0, 2.0]
    assert samples[0].metadata["reward_errors"] == ["short: ValueError: group reward returned 1 values for 3 samples"]


def test_reward_parts_are_kept_and_logged_but_not_added():
    sample = Sample()
    parts = RewardParts(0.75, {"exact": 1.0, "short": 0.5, "note": "text", "bad": float("nan")})
    score([RewardComponent("rubric", 2.0, Constant(parts)), RewardComponent("format", 1.0, Constant(0.25))],
          [sample])
    assert sample.reward == pytest.approx(2.0 * 0.75 + 0.25), "parts explain the value; they are not summed"
    assert sample.reward_components == {"rubric": 0.75, "rubric.exact": 1.0, "rubric.short": 0.5, "format": 0.25}
    assert next(iter(sample.reward_components)) == "rubric", "the first reward stays the primary (accuracy)"


def test_a_non_finite_reward_parts_value_fails_like_a_float():
    sample = Sample()
    reward_set = score([RewardComponent("rubric", 1.0, Constant(RewardParts(float("inf"), {"exact": 1.0})))],
                       [sample])
    assert sample.reward == 0.0 and sample.reward_components == {"rubric": 0.0}
    assert reward_set.pop_metrics() == {"reward/failed/rubric: ValueError": 1.0}
