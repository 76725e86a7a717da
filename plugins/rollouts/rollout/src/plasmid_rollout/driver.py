"""The default rollout driver: every group generated concurrently, scored as it finishes,
filtered, topped up when filters drop groups, and the rest aborted once the batch is full.

One step, for a target of ``P = --prompts-per-step`` groups:

1. take ``ceil(P * --over-sampling)`` groups from the data source and start them all; each
   group's samples are generated concurrently (the engine batches them), then its rewards are
   awaited (concurrently with the generation of other groups), then the filters judge it;
2. whenever the groups still running cannot fill the batch, start more (over-sampled the same
   way), up to ``--rollout-max-launch-factor`` times the initial number in one step;
3. once ``P`` groups are kept, abort what is still running (``ctx.aborting`` set, the engines'
   requests aborted) and return those groups to the data source: reset to their prompts, or
   with ``--partial-rollout`` keeping the tokens generated so far (a multi-turn sample mid-tool-
   call included), which the generate function continues in a later step.

Each sample's sampling seed is derived from ``--seed`` and its index, so a step is reproducible
whatever the batching or the number of engines.

Per-sample metrics of a generate function: a generate function may put ``name -> float`` in
``sample.metadata["rollout_metrics"]`` (:data:`SAMPLE_METRICS_KEY`; the multi-turn one puts
``turns_mean``, ``tool_calls_mean``, ``tool_errors_mean``, ``tool_seconds_mean``,
``truncated_fraction``); the step's metrics then hold ``rollout/<name>``, the mean over the kept
samples that carry the name. Samples without it (single-turn) add no metric. Whatever the generate
function, ``rollout/truncated_fraction`` is the fraction of kept samples cut at the length limit
(``Status.TRUNCATED``: ``--max-new-tokens``, or multi-turn's limits), and
``rollout/reward_out_of_range_fraction`` the fraction of kept samples whose reward's magnitude
exceeds ``--reward-range-bound`` (or is not a number): a finite reward of 1e30 trains nothing (it
swamps its group's normalisation, every other advantage rounds to zero), so it is shown, and the
first step with one says so in one line. Samples whose
``metadata["subset"]`` names the part of a mixture they came from add reward and accuracy per
part (:func:`subset_metrics`).
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from collections import Counter
from dataclasses import replace
from typing import ClassVar

from plasmid.config import Config
from plasmid.context import RolloutContext
from plasmid.kernel_options import GeneralOptions, RolloutOptions, ScheduleOptions
from plasmid.options import Options
from plasmid.types import SUBSET_KEY, Group, RolloutBatch, Sample, SamplingParams, Status, Verdict
from plasmid_rollout.options import RolloutDriverOptions

#: How long aborted generation may take to return before its task is cancelled (seconds).
ABORT_GRACE_SECONDS = 2.0
#: Key of ``sample.metadata`` under which a generate function leaves per-sample metric values.
SAMPLE_METRICS_KEY = "rollout_metrics"


def sample_seed(seed: int, index: int) -> int:
    """The sampling seed of sample ``index`` in a run seeded with ``seed`` (31-bit)."""
    return (seed * 1_000_003 + index * 7_919 + 17) % (2**31 - 1)


def reset_to_prompt(sample: Sample) -> Sample:
    """``sample`` with its response, reward and rollout state cleared (prompt tokens kept)."""
    return replace(sample, tokens=sample.prompt_tokens, response="", response_length=0, loss_mask=None,
                   rollout_logprobs=None, reward=None, reward_components={}, status=Status.PENDING,
                   weight_version=None, metadata={k: v for k, v in sample.metadata.items()
                                                  if k not in ("reward_errors", SAMPLE_METRICS_KEY)})


def sample_metrics(samples: list[Sample]) -> dict[str, float]:
    """``rollout/<name>``: the mean of ``metadata["rollout_metrics"][name]`` over the samples that
    carry it (see the module docstring); empty when none does."""
    columns: dict[str, list[float]] = {}
    for sample in samples:
        values = sample.metadata.get(SAMPLE_METRICS_KEY)
        if isinstance(values, dict):
            for name, value in values.items():
                columns.setdefault(str(name), []).append(float(value))
    return {f"rollout/{name}": sum(values) / len(values) for name, values in columns.items()}


def subset_metrics(samples: list[Sample], reward: str, accuracy: str) -> dict[str, float]:
    """Per part of a mixture (``metadata[SUBSET_KEY]``, see :data:`plasmid.types.SUBSET_KEY`):
    ``<reward>/<component>/<subset>`` means of each reward component and ``<accuracy>/<subset>``
    (primary component >= 1); empty when no sample names a subset."""
    parts: dict[str, list[Sample]] = {}
    for sample in samples:
        subset = sample.metadata.get(SUBSET_KEY)
        if isinstance(subset, str):
            parts.setdefault(subset, []).append(sample)
    metrics: dict[str, float] = {}
    for subset, members in sorted(parts.items()):
        primary = next(iter(members[0].reward_components), None)
        for name in members[0].reward_components:
            values = [s.reward_components.get(name, 0.0) for s in members]
            metrics[f"{reward}/{name}/{subset}"] = sum(values) / len(values)
        if primary is not None:
            metrics[f"{accuracy}/{subset}"] = sum(s.reward_components.get(primary, 0.0) >= 1.0
                                                  for s in members) / len(members)
    return metrics


class AsyncRolloutDriver:
    """Provider ``rollout``; see the module docstring. Built as ``AsyncRolloutDriver(config)``.

    The options it reads (its own and the kernel's) are read once, when it is built.
    """

    option_classes: ClassVar[tuple[type[Options], ...]] = (RolloutDriverOptions, RolloutOptions, ScheduleOptions,
                                                           GeneralOptions)

    def __init__(self, config: Config) -> None:
        rollout = RolloutOptions.of(config)
        self.prompts_per_step = rollout.prompts_per_step
        self.over_sampling = rollout.over_sampling
        driver_options = RolloutDriverOptions.of(config)
        self.max_launch_factor = driver_options.rollout_max_launch_factor
        self.reward_range_bound = driver_options.reward_range_bound
        self.warned_out_of_range = False
        self.partial_rollout = ScheduleOptions.of(config).partial_rollout
        self.seed = GeneralOptions.of(config).seed

    # ------------------------------------------------------------------ one training step
    async def run(self, ctx: RolloutContext, rollout_id: int) -> RolloutBatch:
        target = self.prompts_per_step
        wave = math.ceil(target * self.over_sampling)
        budget = wave * self.max_launch_factor
        began = time.perf_counter()
        ctx = replace(ctx, aborting=asyncio.Event())  # this step's own: set when its unfinished work is aborted
        running: dict[asyncio.Task, Group] = {}
        kept: list[Group] = []
        dropped: Counter = Counter()
        launched = 0

        def launch(count: int) -> None:
            nonlocal launched
            for group in ctx.data_source.get_groups(count):
                running[asyncio.ensure_future(self._generate_group(ctx, group, ctx.sampling))] = group
            launched += count

        launch(min(wave, budget))
        try:
            while running and len(kept) < target:
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in sorted(done, key=lambda t: running[t].index):
                    running.pop(task)
                    group = task.result()
                    verdict = self._judge(ctx, group)
                    if verdict.keep:
                        kept.append(group)
                    else:
                        dropped[verdict.reason or "dropped"] += 1
                short = target - len(kept) - len(running)
                if short > 0 and launched < budget:
                    launch(min(math.ceil(short * self.over_sampling), budget - launched))
        except BaseException:  # a group failed (--reward-errors fail) or we were cancelled: stop the others
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            raise

        aborted = await self._abort(ctx, running)
        kept = sorted(kept[:target], key=lambda g: g.index)
        metrics = self._metrics(kept, launched, dropped, aborted, time.perf_counter() - began)
        metrics.update(ctx.rewards.pop_metrics())
        return RolloutBatch(rollout_id=rollout_id, groups=kept, metrics=metrics)

    async def _generate_group(self, ctx: RolloutContext, group: Group, params: SamplingParams) -> Group:
        """Generate every sample of ``group`` concurrently, then score it (unless aborted).

        A generate function with ``generate_many(ctx, samples, params)`` (see
        :class:`plasmid.protocols.GenerateFn`) gets the whole group in one call; others one call
        per sample."""
        seeded = [replace(params, seed=sample_seed(self.seed, sample.index)) for sample in group.samples]
        many = getattr(ctx.generate, "generate_many", None)
        if callable(many):
            outputs = await many(ctx, group.samples, seeded)
        else:
            outputs = await asyncio.gather(*(ctx.generate(ctx, sample, sample_params)
                                             for sample, sample_params in zip(group.samples, seeded, strict=True)))
        group.samples = [s for out in outputs for s in (out if isinstance(out, list) else [out])]
        if not any(s.status == Status.ABORTED for s in group.samples):
            await ctx.rewards.score_group(group.samples)
        return group

    def _judge(self, ctx: RolloutContext, group: Group) -> Verdict:
        if any(s.status == Status.ABORTED for s in group.samples):
            return Verdict(False, "aborted")
        for name, group_filter in ctx.filters:
            verdict = group_filter(group)
            if not verdict.keep:
                return Verdict(False, verdict.reason or name)
        return Verdict(True)

    async def _abort(self, ctx: RolloutContext, running: dict[asyncio.Task, Group]) -> int:
        """Abort in-flight generation and give the unfinished groups back to the data source.

        ``ctx.aborting`` is set first (a generate function waiting on a tool returns its sample
        as it stands, see :class:`plasmid.protocols.GenerateFn`), then engines finish their
        requests as aborted; a task still busy after ``ABORT_GRACE_SECONDS`` (a generate function
        that ignores the event) is cancelled. With ``--partial-rollout`` the samples of a group
        whose generation returned keep their tokens (they are continued later); otherwise every
        sample goes back as a bare prompt.
        """
        if not running:
            return 0
        ctx.aborting.set()
        for engine in ctx.engines:
            await engine.abort_all()
        finished, stragglers = await asyncio.wait(running, timeout=ABORT_GRACE_SECONDS)
        for task in stragglers:
            task.cancel()
        await asyncio.gather(*stragglers, return_exceptions=True)
        keep_partial = self.partial_rollout
        returned = []
        for task, group in running.items():
            returned_ok = task in finished and task.exception() is None
            samples = task.result().samples if returned_ok else group.samples
            returned.append(Group([s if keep_partial and returned_ok else reset_to_prompt(s) for s in samples],
                                  group.index))
        ctx.data_source.add_groups(sorted(returned, key=lambda g: g.index))
        return len(returned)

    def _metrics(self, groups: list[Group], launched: int, dropped: Counter, aborted: int,
                 seconds: float) -> dict[str, float]:
        samples = [s for g in groups for s in g.samples]
        metrics = {
            "rollout/groups_launched": float(launched),
            "rollout/groups_kept": float(len(groups)),
            "rollout/groups_aborted": float(aborted),
            "rollout/seconds_generating": seconds,
        }
        metrics.update({f"rollout/dropped/{reason}": float(n) for reason, n in dropped.items()})
        if not samples:
            return metrics
        rewards = [s.reward or 0.0 for s in samples]
        lengths = [s.response_length for s in samples]
        mean = sum(rewards) / len(rewards)
        metrics.update({
            "rollout/reward_mean": mean,
            "rollout/reward_std": math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards)),
            "rollout/response_length_mean": sum(lengths) / len(lengths),
            "rollout/response_length_max": float(max(lengths)),
            "rollout/truncated_fraction": sum(s.status == Status.TRUNCATED for s in samples) / len(samples),
            "rollout/tokens_per_second": sum(lengths) / max(seconds, 1e-9),
        })
        outside = [r for r in rewards if not abs(r) <= self.reward_range_bound]  # NaN counts too
        metrics["rollout/reward_out_of_range_fraction"] = len(outside) / len(rewards)
        if outside and not self.warned_out_of_range:
            self.warned_out_of_range = True
            print(f"plasmid: warning: {len(outside)} of {len(rewards)} rewards of this step exceed "
                  f"--reward-range-bound {self.reward_range_bound:g} in magnitude (e.g. {outside[0]:g}); they swamp "
                  f"their group's normalisation (see rollout/reward_out_of_range_fraction)", file=sys.stderr)
        primary = next(iter(samples[0].reward_components), None)
        if primary is not None:
            metrics["rollout/accuracy"] = sum(s.reward_components[primary] >= 1.0 for s in samples) / len(samples)
        for name in samples[0].reward_components:
            values = [s.reward_components.get(name, 0.0) for s in samples]
            metrics[f"rollout/reward/{name}"] = sum(values) / len(values)
        metrics.update(sample_metrics(samples))
        metrics.update(subset_metrics(samples, "rollout/reward", "rollout/accuracy"))
        return metrics

    # ------------------------------------------------------------------ evaluation
    async def evaluate(self, ctx: RolloutContext, groups: list[Group], params: SamplingParams) -> dict[str, float]:
        """One response per eval group with ``params``; ``eval/accuracy`` is the fraction of
        samples whose primary (first) reward is at least 1."""
        ctx = replace(ctx, aborting=asyncio.Event())  # never set: a step's abort (async schedule) spares the eval
        fresh = [Group([reset_to_prompt(s) for s in g.samples], g.index) for g in groups]
        finished = await asyncio.gather(*(self._generate_group(ctx, g, params) for g in fresh))
        scored = [s for g in finished for s in g.samples]
        if not scored:
            return {}
        primary = ctx.rewards.components[0].name
        return {
            "eval/reward": sum(s.reward or 0.0 for s in scored) / len(scored),
            "eval/accuracy": sum(s.reward_components.get(primary, 0.0) >= 1.0 for s in scored) / len(scored),
            "eval/response_length_mean": sum(s.response_length for s in scored) / len(scored),
            **subset_metrics(scored, "eval/reward", "eval/accuracy"),
        }
