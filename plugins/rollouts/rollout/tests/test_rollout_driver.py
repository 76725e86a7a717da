"""The default rollout driver on the real embedded engine, tasks data and match reward."""

from __future__ import annotations

import asyncio

import plasmid_dynamic.plugin
import plasmid_hf.plugin
import plasmid_match.plugin
import plasmid_rollout.plugin
import plasmid_tasks.plugin
import plasmid_torchgen.plugin
import pytest

from plasmid import hookimpl
from plasmid.session import build_rollout_context, instantiate
from plasmid.testing import make_config, make_registry
from plasmid.types import Status

PLUGINS = (plasmid_tasks.plugin, plasmid_hf.plugin, plasmid_torchgen.plugin, plasmid_rollout.plugin,
           plasmid_match.plugin, plasmid_dynamic.plugin)


def generate_plugin(name, factory):
    """A plugin that registers ``factory`` as the generate function ``name``."""

    class Plugin:
        @hookimpl
        def plasmid_generate_fns(self, register):
            register(name, factory)

    return Plugin()


class SlowOddGroups:
    """A generate function (a real provider kind) that holds odd groups back for a while."""

    def __init__(self, config):
        from plasmid.builtin import SingleTurn

        self.inner = SingleTurn(config)

    async def __call__(self, ctx, sample, params):
        if sample.group_index % 2:
            await asyncio.sleep(30)
        return await self.inner(ctx, sample, params)


def make_context(tmp_path, *extra, **options):
    options = {"prompts_per_step": 4, "n_samples_per_prompt": 4, "run_dir": tmp_path / "run", **options}
    plugins = (*PLUGINS, *extra)
    config = make_config(*plugins, **options)
    registry = make_registry(*plugins)
    return build_rollout_context(config, registry), instantiate(registry.get("rollout", "rollout"), config)


def test_a_step_returns_the_requested_groups_scored_and_ordered(tmp_path):
    ctx, driver = make_context(tmp_path)
    batch = asyncio.run(driver.run(ctx, 0))
    assert len(batch.groups) == 4 and [g.index for g in batch.groups] == sorted(g.index for g in batch.groups)
    for sample in batch.samples:
        assert sample.reward in (0.0, 1.0) and sample.reward_components == {"exact": sample.reward}
        assert sample.response_length == len(sample.rollout_logprobs) == len(sample.loss_mask) >= 1
        assert sample.status in (Status.COMPLETED, Status.TRUNCATED) and sample.weight_version == 0
    assert batch.metrics["rollout/groups_kept"] == 4.0
    assert 0.0 <= batch.metrics["rollout/reward_mean"] <= 1.0 and batch.metrics["rollout/tokens_per_second"] > 0


def test_same_seed_gives_the_same_responses(tmp_path):
    first_ctx, first_driver = make_context(tmp_path / "a")
    second_ctx, second_driver = make_context(tmp_path / "b")
    first = asyncio.run(first_driver.run(first_ctx, 0))
    second = asyncio.run(second_driver.run(second_ctx, 0))
    assert [s.tokens for s in first.samples] == [s.tokens for s in second.samples]


class OneByOne:
    """The single-turn generate function without its ``generate_many``: one call per sample."""

    def __init__(self, config):
        from plasmid.builtin import SingleTurn

        self.inner = SingleTurn(config)

    async def __call__(self, ctx, sample, params):
        return await self.inner(ctx, sample, params)


def test_a_group_in_one_generate_many_call_equals_a_call_per_sample(tmp_path):
    ctx, driver = make_context(tmp_path / "many")
    whole_groups = []
    generate_many = ctx.generate.generate_many

    async def counted(ctx, samples, params):
        whole_groups.append(len(samples))
        return await generate_many(ctx, samples, params)

    ctx.generate.generate_many = counted
    together = asyncio.run(driver.run(ctx, 0))
    ctx, driver = make_context(tmp_path / "one", generate_plugin("one-by-one", OneByOne), generate="one-by-one")
    alone = asyncio.run(driver.run(ctx, 0))
    assert whole_groups == [4] * int(together.metrics["rollout/groups_launched"]), "one call per group of 4"
    assert [(s.index, s.tokens, s.reward, s.status) for s in together.samples] == \
        [(s.index, s.tokens, s.reward, s.status) for s in alone.samples]
    assert [lp for s in together.samples for lp in s.rollout_logprobs] == pytest.approx(
        [lp for s in alone.samples for lp in s.rollout_logprobs], abs=1e-5)


def test_filtered_groups_are_counted_and_replaced(tmp_path):
    ctx, driver = make_context(tmp_path, filter=["zero-std"], prompts_per_step=2, n_samples_per_prompt=2)
    batch = asyncio.run(driver.run(ctx, 0))
    dropped = batch.metrics.get("rollout/dropped/zero_std", 0.0)
    accounted = len(batch.groups) + dropped + batch.metrics["rollout/groups_aborted"]
    assert batch.metrics["rollout/groups_launched"] == accounted
    assert dropped > 0, "an untrained model gives mostly all-zero groups; none were dropped"
    for group in batch.groups:
        assert len(set(group.rewards)) > 1


def test_once_the_batch_is_full_the_rest_is_aborted_and_returned(tmp_path):
    ctx, driver = make_context(tmp_path, generate_plugin("slow-odd", SlowOddGroups), generate="slow-odd",
                               over_sampling=2.0)
    batch = asyncio.run(asyncio.wait_for(driver.run(ctx, 0), timeout=20))
    assert [g.index % 2 for g in batch.groups] == [0, 0, 0, 0]
    assert batch.metrics["rollout/groups_aborted"] == 4.0
    returned = ctx.data_source.get_groups(4)
    assert sorted(g.index for g in returned) == [1, 3, 5, 7]
    assert all(s.response_length == 0 and s.reward is None for g in returned for s in g.samples)


def test_evaluation_is_greedy_and_reports_accuracy(tmp_path):
    ctx, driver = make_context(tmp_path)
    groups = ctx.data_source.eval_groups()
    first = asyncio.run(driver.evaluate(ctx, groups, ctx.eval_sampling()))
    second = asyncio.run(driver.evaluate(ctx, groups, ctx.eval_sampling()))
    assert 0.0 <= first["eval/accuracy"] <= 1.0 and first == second
    assert ctx.data_source.eval_groups()[0].samples[0].response_length == 0, "evaluation changed the eval split"


@pytest.mark.parametrize("over_sampling", [1.0, 1.5])
def test_the_launch_budget_bounds_a_step(tmp_path, over_sampling):
    ctx, driver = make_context(tmp_path, filter=["zero-std"], prompts_per_step=3, n_samples_per_prompt=2,
                               over_sampling=over_sampling, rollout_max_launch_factor=1)
    batch = asyncio.run(driver.run(ctx, 0))
    assert batch.metrics["rollout/groups_launched"] <= int(3 * over_sampling + 0.999)


class LongOddGroups:
    """A generate function (a real provider kind) that lets odd groups run long: no stop token,
    a large budget, so they are still decoding when the even groups fill the batch."""

    def __init__(self, config):
        from plasmid.builtin import SingleTurn

        self.inner = SingleTurn(config)

    async def __call__(self, ctx, sample, params):
        if sample.group_index % 2:
            from dataclasses import replace

            params = replace(params, stop_token_ids=(), max_new_tokens=40)
        return await self.inner(ctx, sample, params)


def test_partial_rollout_keeps_aborted_tokens_and_continues_them(tmp_path):
    ctx, driver = make_context(tmp_path, generate_plugin("long-odd", LongOddGroups), generate="long-odd",
                               over_sampling=2.0, partial_rollout=True, mask_offpolicy_in_partial_rollout=True)
    batch = asyncio.run(driver.run(ctx, 0))
    assert all(g.index % 2 == 0 for g in batch.groups)
    returned = ctx.data_source.get_groups(4)
    partial = [s for g in returned for s in g.samples if s.status == Status.ABORTED]
    assert partial, "no aborted sample kept its tokens"
    assert all(0 < s.response_length < 40 and len(s.rollout_logprobs) == s.response_length for s in partial)
    sample = partial[0]
    before = list(sample.tokens)
    from plasmid.types import SamplingParams

    continued = asyncio.run(ctx.generate(ctx, sample, SamplingParams(max_new_tokens=40)))
    assert continued.tokens[: len(before)] == before, "continuing changed the tokens already generated"
    assert continued.response_length == 40 and continued.status == Status.TRUNCATED
    old = len(before) - continued.prompt_length
    assert continued.loss_mask == [0] * old + [1] * (40 - old)
    assert len(continued.rollout_logprobs) == 40
