"""A rollout engine that answers from a script, for testing generate functions and drivers.

::

    from plasmid.testing.scripted import Reply, ScriptedEngine

    engine = ScriptedEngine([Reply([5, 6, 2], [-0.1, -0.2, -0.3]), Reply([7, 2])])
    output = await engine.generate([1, 4], SamplingParams(max_new_tokens=8, stop_token_ids=(2,)))

Each :meth:`ScriptedEngine.generate` call takes the next :class:`Reply` and applies the request's
parameters to it as an engine would: the reply is cut after its first token in
``params.stop_token_ids`` (status ``COMPLETED``), else at ``params.max_new_tokens`` (status
``TRUNCATED``), else it keeps the reply's own status (``COMPLETED`` by default). Every call is
recorded in :attr:`ScriptedEngine.calls` (the prompt ids and the parameters), so a test can check
what a generate function sent. Imports no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from plasmid.protocols import NamedTensor
from plasmid.types import GenerationOutput, SamplingParams, Status


@dataclass
class Reply:
    """One scripted response: its token ids, their log-probs (default ``-0.5`` each) and the
    status it ends with when neither a stop token nor the length limit ends it first."""

    token_ids: list[int]
    logprobs: list[float] | None = None
    status: Status = Status.COMPLETED

    def __post_init__(self) -> None:
        if self.logprobs is not None and len(self.logprobs) != len(self.token_ids):
            raise ValueError(f"Reply has {len(self.token_ids)} token ids but {len(self.logprobs)} log-probs")


@dataclass
class Call:
    """What one ``generate`` call received."""

    prompt_ids: list[int]
    params: SamplingParams


#: A script: the replies in order, or a function of the call (prompt ids, parameters) to the reply.
Script = Sequence[Reply] | Callable[[list[int], SamplingParams], Reply]


@dataclass
class ScriptedEngine:
    """A :class:`plasmid.protocols.RolloutEngine` replaying ``script``; see the module docstring.

    ``abort_all`` counts as an abort of nothing in flight (a scripted reply returns at once);
    weight updates only set :attr:`weight_version`.
    """

    script: Script
    weight_version: int = 0
    calls: list[Call] = field(default_factory=list)
    aborts: int = 0

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerationOutput:
        self.calls.append(Call(list(prompt_ids), params))
        if callable(self.script):
            reply = self.script(list(prompt_ids), params)
        else:
            position = len(self.calls) - 1
            if position >= len(self.script):
                raise RuntimeError(f"ScriptedEngine: call {position + 1} has no reply; the script has "
                                   f"{len(self.script)}")
            reply = self.script[position]
        ids = list(reply.token_ids)
        logprobs = list(reply.logprobs) if reply.logprobs is not None else [-0.5] * len(ids)
        status = reply.status
        stops = [i for i, token in enumerate(ids) if token in params.stop_token_ids]
        if stops and stops[0] < params.max_new_tokens:
            end, status = stops[0] + 1, Status.COMPLETED
        elif len(ids) > params.max_new_tokens:
            end, status = params.max_new_tokens, Status.TRUNCATED
        else:
            end = len(ids)
        return GenerationOutput(token_ids=ids[:end], logprobs=logprobs[:end], status=status,
                                weight_version=self.weight_version)

    async def response_logprobs(self, token_ids: list[int], prompt_length: int, temperature: float) -> list[float]:
        return [-0.5] * (len(token_ids) - prompt_length)

    #: the deprecated name of :meth:`response_logprobs` (see :class:`plasmid.protocols.RolloutEngine`)
    score = response_logprobs

    async def abort_all(self) -> int:
        self.aborts += 1
        return 0

    async def update_weights(self, named_tensors: Iterable[NamedTensor], weight_version: int) -> None:
        self.weight_version = weight_version

    async def get_weights(self, names: Sequence[str]) -> dict[str, Any]:
        return {}

    async def flush_cache(self) -> None:
        """Nothing is cached."""

    async def release_memory(self) -> None:
        """Nothing is held."""

    async def resume_memory(self) -> None:
        """Nothing is held."""

    async def shutdown(self) -> None:
        """Nothing runs."""


@dataclass
class BatchingScriptedEngine(ScriptedEngine):
    """A :class:`ScriptedEngine` that also has the optional ``generate_many`` (see
    :class:`plasmid.protocols.RolloutEngine`); test support. Each call answers like its requests'
    ``generate`` calls in order, and records its size in :attr:`batches`."""

    batches: list[int] = field(default_factory=list)

    async def generate_many(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[GenerationOutput]:
        self.batches.append(len(prompts))
        return [await self.generate(prompt_ids, call_params)
                for prompt_ids, call_params in zip(prompts, params, strict=True)]
