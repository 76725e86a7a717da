"""The token-in-token-out check of a conversation's sample, for any engine.

A generate function that talks to an engine several times (``multiturn``'s tool loop, the agent
gateway) must build a sample whose ``tokens`` are, in order, the first request's prompt ids,
then for each request the ids the engine returned (or the leading part of them the generate
function keeps: ``multiturn`` cuts a turn at its tool call) followed by the ids the environment
appended before the next request (a tool answer, a chat template's turn markers), where each
request's prompt is exactly the sample's tokens so far: nothing decoded and encoded again.
``loss_mask`` is 1 on the engine's ids and 0 on the environment's; ``rollout_logprobs`` are the
engine's log-probs of its ids and 0.0 on the environment's.

::

    from plasmid.testing.conversation import RecordingEngine, check_token_in_token_out

    engine = RecordingEngine(real_engine)            # records every generate call
    sample = await generate(ctx_using(engine), prompt_sample, params)
    check_token_in_token_out(sample, engine.calls, environment=[tool_ids], kept=[first_turn_length, None])

The check works on any engine (scripted, torchgen, SGLang, vLLM); it imports no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from plasmid.types import GenerationOutput, Sample, SamplingParams


@dataclass
class EngineCall:
    """One recorded ``generate`` call: what was sent and what came back."""

    prompt_ids: list[int]
    params: SamplingParams
    output: GenerationOutput


@dataclass
class RecordingEngine:
    """Wraps a :class:`plasmid.protocols.RolloutEngine`: ``generate`` calls go to ``engine`` and are
    recorded, in the order they return, in :attr:`calls`; every other attribute is the engine's."""

    engine: Any
    calls: list[EngineCall] = field(default_factory=list)

    def __getattr__(self, name: str) -> Any:
        if name == "engine":  # not yet set (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.engine, name)

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerationOutput:
        """The wrapped engine's output for the request, recorded."""
        output: GenerationOutput = await self.engine.generate(list(prompt_ids), params)
        self.calls.append(EngineCall(list(prompt_ids), params, output))
        return output


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


def check_token_in_token_out(sample: Sample, calls: Sequence[EngineCall], environment: Sequence[Sequence[int]],
                             kept: Sequence[int | None] | None = None) -> None:
    """Raise ``AssertionError`` (naming the first difference) unless ``sample`` is exactly ``calls``'
    engine ids and ``environment``'s ids laid out as the module docstring says.

    :param calls: the engine requests of the sample, in order (:attr:`RecordingEngine.calls`).
    :param environment: ``environment[k]``: the ids appended after request ``k``'s kept ids; one
        entry per request but the last, and optionally one after the last (a tool answer that ends
        the sample, e.g. cut to the response budget).
    :param kept: ``kept[k]``: how many leading ids of request ``k``'s output the sample keeps
        (``None``: all of them); default all, for every request.
    """
    _expect(len(calls) > 0, "no engine request was made for the sample")
    _expect(len(environment) in (len(calls) - 1, len(calls)),
            f"{len(calls)} engine requests need {len(calls) - 1} environment segments (or one more after the "
            f"last), got {len(environment)}")
    counts = list(kept) if kept is not None else [None] * len(calls)
    _expect(len(counts) == len(calls), f"kept has {len(counts)} entries for {len(calls)} engine requests")
    tokens = list(calls[0].prompt_ids)
    mask: list[int] = []
    logprobs: list[float] = []
    for k, call in enumerate(calls):
        _expect(call.prompt_ids == tokens,
                f"engine request {k}'s prompt is not the sample's tokens so far (a prefix-extension): "
                f"sent {call.prompt_ids}, expected {tokens}")
        output = call.output
        _expect(len(output.logprobs) == len(output.token_ids),
                f"engine request {k} returned {len(output.token_ids)} ids but {len(output.logprobs)} log-probs")
        count = counts[k]
        keep = len(output.token_ids) if count is None else count
        _expect(0 <= keep <= len(output.token_ids),
                f"kept[{k}] = {keep}, but engine request {k} returned {len(output.token_ids)} ids")
        tokens += output.token_ids[:keep]
        mask += [1] * keep
        logprobs += list(output.logprobs[:keep])
        if k < len(environment):
            appended = list(environment[k])
            tokens += appended
            mask += [0] * len(appended)
            logprobs += [0.0] * len(appended)
    prompt_length = len(calls[0].prompt_ids)
    _expect(sample.tokens == tokens, f"the sample's tokens {sample.tokens} are not the engine's and the "
                                     f"environment's ids {tokens}")
    _expect(sample.response_length == len(tokens) - prompt_length,
            f"response_length {sample.response_length}, expected {len(tokens) - prompt_length}")
    _expect(sample.prompt_tokens == list(calls[0].prompt_ids), "the sample's prompt is not the first request's")
    _expect(list(sample.loss_mask or []) == mask, f"loss_mask {sample.loss_mask}, expected {mask}")
    _expect(list(sample.rollout_logprobs or []) == logprobs,
            f"rollout_logprobs {sample.rollout_logprobs} are not the engine's {logprobs}")
