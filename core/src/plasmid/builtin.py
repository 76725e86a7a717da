"""The kernel's own providers: the single-turn generate function used when ``--generate`` is unset."""

from __future__ import annotations

from plasmid import hookimpl
from plasmid.context import RolloutContext
from plasmid.types import Sample, SamplingParams


class SingleTurn:
    """One engine call per sample: the prompt's tokens in, the response and its log-probs out.

    Every response token is trained on (``loss_mask`` all ones); the engine is
    ``ctx.engine_for(sample)``. Any earlier response of the sample is replaced.
    """

    def __init__(self, config: object) -> None:
        self.config = config

    async def __call__(self, ctx: RolloutContext, sample: Sample, params: SamplingParams) -> Sample:
        engine = ctx.engine_for(sample)
        prompt_ids = sample.prompt_tokens
        output = await engine.generate(prompt_ids, params)
        sample.tokens = list(prompt_ids) + list(output.token_ids)
        sample.response_length = len(output.token_ids)
        sample.response = ctx.tokenizer.decode(output.token_ids, skip_special_tokens=True)
        sample.loss_mask = [1] * sample.response_length
        sample.rollout_logprobs = list(output.logprobs)
        sample.status = output.status
        sample.weight_version = output.weight_version
        return sample


@hookimpl
def plasmid_generators(register):
    register("single-turn", SingleTurn, kind="generate", default=True)
