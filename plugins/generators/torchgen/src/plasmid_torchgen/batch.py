"""The requests being decoded together, and the state they share between decoding steps.

A :class:`DecodeBatch` is left-padded: row ``i`` of the KV cache and of the attention mask
ends with the same column for every row, and each row's pending input token has its own
position (``next_positions``), so rows of different lengths decode in one forward pass. Rows
leave when they finish; another batch's rows join by left-padding (see :mod:`.kv_cache`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from plasmid.types import GenerationOutput, SamplingParams, Status
from plasmid_torchgen import kv_cache
from plasmid_torchgen.sampling import SamplingBatch


class StopStrings:
    """Whether a response's text holds one of its stop strings, checked after each new token on the
    text of the last few tokens only.

    The text of the last :attr:`window` tokens is decoded (``decode``: special tokens skipped, as the
    agent gateway reads a reply): ``4 * len(longest stop) + 4`` tokens, enough for a stop string whose
    every character takes several byte-level tokens. A stop string is found by the first check whose
    window holds it, which is the check after the token that completed it, so the response ends on
    that token. The cost is one decode of at most :attr:`window` tokens per step of such a request.
    """

    def __init__(self, stops: tuple[str, ...], decode: Callable[[list[int]], str]) -> None:
        if not all(isinstance(stop, str) and stop for stop in stops):
            raise ValueError(f"torchgen: stop strings must be non-empty strings, got {stops!r}")
        self.stops = stops
        self.decode = decode
        self.window = 4 * max(len(stop) for stop in stops) + 4
        #: the stop string that ended the response ('' while none did)
        self.matched = ""

    def completed_by(self, token_ids: list[int]) -> bool:
        """Whether the text of the tail of ``token_ids`` holds a stop string (recorded in :attr:`matched`)."""
        text = self.decode(token_ids[-self.window:])
        for stop in self.stops:
            if stop in text:
                self.matched = stop
                return True
        return False


@dataclass(eq=False)
class Request:
    """One ``generate`` call: its prompt and parameters in, its response accumulating.

    ``future`` belongs to the event loop that called ``generate``; the engine resolves it there
    (the worker thread only reads whether it is done). ``token_ids``/``logprobs`` grow on the
    engine's worker thread, one entry per decoding step.

    A request with stop strings (``params.stop``) carries a :class:`StopStrings` (``stop_strings``);
    one without has ``None`` there, and its decoding steps do no text work at all.
    """

    prompt_ids: list[int]
    params: SamplingParams
    future: asyncio.Future
    generator: torch.Generator | None = None
    stop_token_ids: frozenset[int] = frozenset()
    stop_strings: StopStrings | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    status: Status = Status.PENDING

    @classmethod
    def create(cls, prompt_ids: list[int], params: SamplingParams, future: asyncio.Future,
               device: torch.device | str = "cpu", decode: Callable[[list[int]], str] | None = None) -> Request:
        """A request; with a ``params.seed``, its own generator on ``device`` (where the engine samples).
        ``decode`` (token ids to text, special tokens skipped) is needed when ``params.stop`` is set."""
        generator = None if params.seed is None else torch.Generator(device=device).manual_seed(params.seed)
        stop_strings = None
        if params.stop:
            if decode is None:
                raise ValueError("torchgen: a request with stop strings needs the tokenizer's decode")
            stop_strings = StopStrings(params.stop, decode)
        return cls(list(prompt_ids), params, future, generator, frozenset(params.stop_token_ids), stop_strings)

    @property
    def abandoned(self) -> bool:
        """The caller stopped waiting (its task was cancelled): nothing to decode it for."""
        return self.future.done()

    def finish(self) -> None:
        """Set the final status of a response that ended (a stop token, or ``max_new_tokens``)."""
        stopped = self.token_ids[-1] in self.stop_token_ids or (self.stop_strings is not None
                                                                  and self.stop_strings.matched)
        self.status = Status.COMPLETED if stopped else Status.TRUNCATED

    def output(self, weight_version: int) -> GenerationOutput:
        return GenerationOutput(list(self.token_ids), list(self.logprobs), self.status, weight_version)


class DecodeBatch:
    """Rows that decode together.

    :ivar requests: one per row, in row order.
    :ivar cache: the rows' KV cache (``columns`` cached positions).
    :ivar attention_mask: ``[rows, columns]`` int64, 1 on cached real tokens, 0 on left padding.
    :ivar next_tokens: ``[rows, 1]`` int64, each row's sampled token not yet fed to the model.
    :ivar next_positions: ``[rows, 1]`` int64, the position ids of ``next_tokens``.
    :ivar sampling: the rows' sampling settings.
    """

    def __init__(self, requests: list[Request], cache: kv_cache.DynamicCache, attention_mask: torch.Tensor,
                 next_tokens: torch.Tensor, next_positions: torch.Tensor) -> None:
        self.requests = requests
        self.cache = cache
        self.attention_mask = attention_mask
        self.next_tokens = next_tokens
        self.next_positions = next_positions
        self.sampling = SamplingBatch([r.params for r in requests], [r.generator for r in requests])

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def can_join(self) -> bool:
        """Whether other rows can be joined into this batch (see :func:`kv_cache.supports_surgery`)."""
        return kv_cache.supports_surgery(self.cache)

    def record(self, tokens: torch.Tensor, logprobs: torch.Tensor) -> list[Request]:
        """Append each row's sampled token (``[rows]``); drop and return the rows that finished."""
        finished_rows = []
        # The hot loop of the engine (rows x steps): plain list work, no per-row method calls.
        rows = zip(self.requests, tokens.tolist(), logprobs.tolist(), strict=True)
        for row, (request, token_id, logprob) in enumerate(rows):
            request.token_ids.append(token_id)
            request.logprobs.append(logprob)
            if token_id in request.stop_token_ids or len(request.token_ids) >= request.params.max_new_tokens:
                finished_rows.append(row)
            elif request.stop_strings is not None and request.stop_strings.completed_by(request.token_ids):
                finished_rows.append(row)
        self.next_tokens = tokens.unsqueeze(1)
        finished = [self.requests[row] for row in finished_rows]
        for request in finished:
            request.finish()
        if finished:
            gone = set(finished_rows)
            self.retain([row for row in range(len(self)) if row not in gone])
        return finished

    def drop_abandoned(self) -> None:
        """Remove rows whose caller stopped waiting."""
        if any(request.abandoned for request in self.requests):
            self.retain([row for row, request in enumerate(self.requests) if not request.abandoned])

    def retain(self, rows: list[int]) -> None:
        """Keep only ``rows`` (indices, ascending); cut columns that became padding everywhere."""
        if len(rows) == len(self):
            return
        self.requests = [self.requests[row] for row in rows]
        if not rows:
            return
        index = torch.tensor(rows, dtype=torch.int64)
        kv_cache.select_rows(self.cache, index)
        self.attention_mask = self.attention_mask[index]
        self.next_tokens = self.next_tokens[index]
        self.next_positions = self.next_positions[index]
        self.sampling = SamplingBatch([r.params for r in self.requests], [r.generator for r in self.requests])
        if kv_cache.supports_surgery(self.cache):
            padding_everywhere = int(self.attention_mask.any(0).int().argmax())
            if padding_everywhere:
                kv_cache.drop_leading_columns(self.cache, padding_everywhere)
                self.attention_mask = self.attention_mask[:, padding_everywhere:]

    def join(self, other: DecodeBatch) -> None:
        """Append ``other``'s rows (``other`` is consumed). Requires :attr:`can_join`."""
        first_pad, second_pad = kv_cache.padding_to_join(self.cache, other.cache)
        kv_cache.join_rows(self.cache, other.cache)
        self.attention_mask = torch.cat([_pad_left(self.attention_mask, first_pad),
                                         _pad_left(other.attention_mask, second_pad)])
        self.next_tokens = torch.cat([self.next_tokens, other.next_tokens])
        self.next_positions = torch.cat([self.next_positions, other.next_positions])
        self.requests = self.requests + other.requests
        self.sampling = SamplingBatch([r.params for r in self.requests], [r.generator for r in self.requests])


def _pad_left(mask: torch.Tensor, columns: int) -> torch.Tensor:
    return torch.nn.functional.pad(mask, (columns, 0)) if columns else mask
