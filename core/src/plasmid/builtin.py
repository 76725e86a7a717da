"""The kernel's own providers: the single-turn generate function used when ``--generate`` is
unset, and the ``local`` runtime (everything in this process)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from plasmid import hookimpl
from plasmid.config import Config
from plasmid.errors import UsageError
from plasmid.kernel_options import ScheduleOptions
from plasmid.protocols import RolloutView
from plasmid.session import Session, build_session
from plasmid.startup import Startup
from plasmid.types import ROUTED_EXPERTS_KEY, GenerationOutput, Sample, SamplingParams, Status


class SingleTurn:
    """One engine call per sample: the prompt's tokens in, the response and its log-probs out.

    The engine is ``ctx.engine_for(sample)``. By the sample's status:

    - ``PENDING`` (or anything unfinished without a response): generate from the prompt;
    - ``ABORTED`` with a partial response (``--partial-rollout`` kept it): continue from it
      with the remaining token budget; the old tokens keep their log-probs and, with
      ``--mask-offpolicy-in-partial-rollout``, get ``loss_mask`` 0 (older weights made them), and
      the sample keeps the weight version that began it (its staleness is its oldest token's);
    - ``COMPLETED`` / ``TRUNCATED``: already finished; returned unchanged.

    Every newly generated token is trained on (``loss_mask`` 1). The engine's expert routing,
    when it reports one (``--return-routed-experts``), goes to ``metadata[ROUTED_EXPERTS_KEY]``.
    """

    #: copies the engine's routing into the sample (``--return-routed-experts``; see GenerateFn)
    carries_routed_experts = True

    def __init__(self, config: Config) -> None:
        self.mask_offpolicy = ScheduleOptions.of(config).mask_offpolicy_in_partial_rollout

    async def __call__(self, ctx: RolloutView, sample: Sample, params: SamplingParams) -> Sample:
        call = self._call(sample, params)
        if call is None:
            return sample
        prefix, budget = call
        return self._finish(ctx, sample, prefix, await ctx.engine_for(sample).generate(prefix, budget))

    async def generate_many(self, ctx: RolloutView, samples: list[Sample],
                            params: list[SamplingParams]) -> list[Sample]:
        """``[await self(ctx, s, p) for s, p in zip(samples, params)]``, run concurrently.

        When every engine of the run has ``generate_many`` (see
        :class:`plasmid.protocols.RolloutEngine`; torchgen does), each engine gets its share of
        the samples in one call instead of a task per sample. Otherwise (the Ray runtime's engine
        proxies) each sample is a call of its own, as :meth:`__call__` makes it, so that a
        balancing ``engine_for`` sees each request in flight before it picks the next one's
        engine (choosing all the engines first would send every group to the same one)."""
        if not all(callable(getattr(engine, "generate_many", None)) for engine in ctx.engines):
            return list(await asyncio.gather(*(self(ctx, sample, sample_params)
                                               for sample, sample_params in zip(samples, params, strict=True))))
        calls: dict[int, tuple[Any, list[int], list[list[int]], list[SamplingParams]]] = {}
        for position, (sample, sample_params) in enumerate(zip(samples, params, strict=True)):
            call = self._call(sample, sample_params)
            if call is not None:
                engine = ctx.engine_for(sample)
                entry = calls.setdefault(id(engine), (engine, [], [], []))
                entry[1].append(position)
                entry[2].append(call[0])
                entry[3].append(call[1])
        answers = await asyncio.gather(*(engine.generate_many(prefixes, budgets)
                                         for engine, _, prefixes, budgets in calls.values()))
        for (_, positions, prefixes, _), outputs in zip(calls.values(), answers, strict=True):
            for position, prefix, output in zip(positions, prefixes, outputs, strict=True):
                self._finish(ctx, samples[position], prefix, output)
        return samples

    def _call(self, sample: Sample, params: SamplingParams) -> tuple[list[int], SamplingParams] | None:
        """The engine call ``sample`` needs (its prefix and sampling parameters); ``None`` when it
        needs none (already finished, or a resumed response at its budget: then TRUNCATED)."""
        if sample.status in (Status.COMPLETED, Status.TRUNCATED):
            return None
        resumed = sample.status == Status.ABORTED and sample.response_length > 0
        old_length = sample.response_length if resumed else 0
        if old_length >= params.max_new_tokens:
            sample.status = Status.TRUNCATED
            return None
        prefix = list(sample.tokens) if resumed else sample.prompt_tokens
        budget = replace(params, max_new_tokens=params.max_new_tokens - old_length) if old_length else params
        return prefix, budget

    def _finish(self, ctx: RolloutView, sample: Sample, prefix: list[int], output: GenerationOutput) -> Sample:
        """``sample`` continued from ``prefix`` by the engine's ``output`` (see the class docs)."""
        old_length = len(prefix) - sample.prompt_length
        old_logprobs = list(sample.rollout_logprobs or [])[:old_length]
        old_mask = [0] * old_length if self.mask_offpolicy else list(sample.loss_mask or [1] * old_length)[:old_length]
        sample.tokens = prefix + list(output.token_ids)
        sample.response_length = old_length + len(output.token_ids)
        sample.response = ctx.tokenizer.decode(sample.response_tokens, skip_special_tokens=True)
        sample.loss_mask = old_mask + [1] * len(output.token_ids)
        sample.rollout_logprobs = old_logprobs + list(output.logprobs)
        sample.status = output.status
        began = sample.weight_version if old_length else None
        sample.weight_version = output.weight_version if began is None else min(began, output.weight_version)
        if output.routed_experts is not None:           # the engine's routing covers prefix + response
            sample.metadata[ROUTED_EXPERTS_KEY] = output.routed_experts
        else:                                           # a resumed sample's old routing no longer fits
            sample.metadata.pop(ROUTED_EXPERTS_KEY, None)
        return sample


class LocalRuntime:
    """Runtime ``local``: every provider in this process, one trainer, ``--engines`` engines."""

    def __init__(self, config: Config) -> None:
        workers = ScheduleOptions.of(config).trainer_workers
        if workers != 1:
            raise UsageError(f"--trainer-workers {workers} needs a multi-process runtime; "
                             f"the local runtime runs one trainer (try --runtime ray)")

    async def start(self, startup: Startup) -> Session:
        session = build_session(startup)
        session.runtime = self
        return session

    async def shutdown(self) -> None:
        """Nothing beyond the engines, which the session shuts down."""


@hookimpl
def plasmid_generate_fns(register: Any) -> None:
    register("single-turn", SingleTurn, default=True)


@hookimpl
def plasmid_runtimes(register: Any) -> None:
    register("local", LocalRuntime, default=True)
