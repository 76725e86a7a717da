"""The kernel's own providers: the single-turn generate function used when ``--generate`` is
unset, and the ``local`` runtime (everything in this process)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from plasmid import hookimpl
from plasmid.config import Config
from plasmid.errors import UsageError
from plasmid.kernel_options import ScheduleOptions
from plasmid.protocols import RolloutView
from plasmid.session import Session, build_session
from plasmid.startup import Startup
from plasmid.types import ROUTED_EXPERTS_KEY, Sample, SamplingParams, Status


class SingleTurn:
    """One engine call per sample: the prompt's tokens in, the response and its log-probs out.

    The engine is ``ctx.engine_for(sample)``. By the sample's status:

    - ``PENDING`` (or anything unfinished without a response): generate from the prompt;
    - ``ABORTED`` with a partial response (``--partial-rollout`` kept it): continue from it
      with the remaining token budget; the old tokens keep their log-probs and, with
      ``--mask-offpolicy-in-partial-rollout``, get ``loss_mask`` 0 (older weights made them);
    - ``COMPLETED`` / ``TRUNCATED``: already finished; returned unchanged.

    Every newly generated token is trained on (``loss_mask`` 1). The engine's expert routing,
    when it reports one (``--return-routed-experts``), goes to ``metadata[ROUTED_EXPERTS_KEY]``.
    """

    #: copies the engine's routing into the sample (``--return-routed-experts``; see GenerateFn)
    carries_routed_experts = True

    def __init__(self, config: Config) -> None:
        self.mask_offpolicy = ScheduleOptions.of(config).mask_offpolicy_in_partial_rollout

    async def __call__(self, ctx: RolloutView, sample: Sample, params: SamplingParams) -> Sample:
        if sample.status in (Status.COMPLETED, Status.TRUNCATED):
            return sample
        resumed = sample.status == Status.ABORTED and sample.response_length > 0
        old_length = sample.response_length if resumed else 0
        if old_length >= params.max_new_tokens:
            sample.status = Status.TRUNCATED
            return sample
        prefix = list(sample.tokens) if resumed else sample.prompt_tokens
        old_logprobs = list(sample.rollout_logprobs or [])[:old_length]
        old_mask = [0] * old_length if self.mask_offpolicy else list(sample.loss_mask or [1] * old_length)[:old_length]
        budget = replace(params, max_new_tokens=params.max_new_tokens - old_length) if old_length else params
        output = await ctx.engine_for(sample).generate(prefix, budget)
        sample.tokens = prefix + list(output.token_ids)
        sample.response_length = old_length + len(output.token_ids)
        sample.response = ctx.tokenizer.decode(sample.response_tokens, skip_special_tokens=True)
        sample.loss_mask = old_mask + [1] * len(output.token_ids)
        sample.rollout_logprobs = old_logprobs + list(output.logprobs)
        sample.status = output.status
        sample.weight_version = output.weight_version
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
