"""The kernel's own providers: the single-turn generate function used when ``--generate`` is
unset, and the ``local`` runtime."""

from __future__ import annotations

from dataclasses import replace

from plasmid import hookimpl
from plasmid.context import RolloutContext
from plasmid.types import Sample, SamplingParams, Status


class SingleTurn:
    """One engine call per sample: the prompt's tokens in, the response and its log-probs out.

    The engine is ``ctx.engine_for(sample)``. By the sample's status:

    - ``PENDING`` (or anything unfinished without a response): generate from the prompt;
    - ``ABORTED`` with a partial response (``--partial-rollout`` kept it): continue from it
      with the remaining token budget; the old tokens keep their log-probs and, with
      ``--mask-offpolicy-in-partial-rollout``, get ``loss_mask`` 0 (older weights made them);
    - ``COMPLETED`` / ``TRUNCATED``: already finished; returned unchanged.

    Every newly generated token is trained on (``loss_mask`` 1).
    """

    def __init__(self, config: object) -> None:
        self.mask_offpolicy = bool(getattr(config.option, "mask_offpolicy_in_partial_rollout", False))

    async def __call__(self, ctx: RolloutContext, sample: Sample, params: SamplingParams) -> Sample:
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
        return sample


@hookimpl
def plasmid_generators(register):
    register("single-turn", SingleTurn, kind="generate", default=True)


@hookimpl
def plasmid_runtimes(register):
    register("local", "plasmid.session:LocalRuntime", default=True)
