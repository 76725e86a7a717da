"""The token sequences ``plasmid parity`` scores: read from a JSON-lines file (``--sequences``), or
prompts rendered with the model's tokenizer (its chat template when it has one) with a response
sampled by the engine."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plasmid.errors import UsageError
from plasmid.types import ROUTED_EXPERTS_KEY, Sample, SamplingParams
from plasmid_torch.prompts import PromptEncoder

#: The prompts scored without ``--prompt``: digits and ``+``/``=`` only, which every tokenizer
#: encodes (the quickstart's tiny models know nothing else), of a few lengths.
DEFAULT_PROMPTS = ("1+2=", "12+34=", "7+8+9=", "305+4061+27=")


@dataclass
class ScoredSequence:
    """One sequence to score: prompt and response ids together, the response its last tokens.

    :ivar routing: the engine's MoE routing of the sequence when it reported one (sampled with
        ``--return-routed-experts``), carried to the trainer as training carries it.
    :ivar origin: where it came from (``FILE:LINE`` or ``prompt N``), named in errors.
    """

    token_ids: list[int]
    prompt_length: int
    routing: Any = None
    origin: str = ""

    def sample(self, index: int) -> Sample:
        """The sequence as the :class:`~plasmid.types.Sample` a trainer scores."""
        metadata = {} if self.routing is None else {ROUTED_EXPERTS_KEY: self.routing}
        return Sample(tokens=list(self.token_ids), response_length=len(self.token_ids) - self.prompt_length,
                      index=index, metadata=metadata)


def read_sequences(path: Path, vocab_size: int | None) -> list[ScoredSequence]:
    """The sequences of a JSON-lines file, one object per non-blank line:
    ``{"token_ids": [int, ...], "prompt_length": int}`` with ``1 <= prompt_length < len(token_ids)``
    and every id in ``[0, vocab_size)`` (when known). A bad line is a one-line :class:`UsageError`
    naming the file and line."""
    if not path.is_file():
        raise UsageError(f"--sequences {path}: no such file")
    sequences = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"--sequences {path}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        tokens = record.get("token_ids") if isinstance(record, dict) else None
        prompt_length = record.get("prompt_length") if isinstance(record, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise UsageError(f'{where}: expected {{"token_ids": [int, ...], "prompt_length": int}}')
        if not isinstance(prompt_length, int) or not 1 <= prompt_length < len(tokens):
            raise UsageError(f"{where}: prompt_length must be an integer in [1, {len(tokens) - 1}] (at least one "
                             f"prompt and one response token), got {prompt_length!r}")
        outside = [t for t in tokens if t < 0 or (vocab_size is not None and t >= vocab_size)]
        if outside:
            raise UsageError(f"{where}: token id {outside[0]} is outside the model's vocabulary [0, {vocab_size})")
        sequences.append(ScoredSequence(list(tokens), prompt_length, origin=f"{path.name}:{number}"))
    if not sequences:
        raise UsageError(f"--sequences {path}: the file holds no sequence")
    return sequences


def encode_prompts(model: str, prompts: Sequence[str]) -> list[list[int]]:
    """Each prompt as token ids: as one user message through the model's chat template when its
    tokenizer has one, else as plain text (:class:`plasmid_torch.prompts.PromptEncoder`; text the
    tokenizer cannot encode is a one-line :class:`UsageError`)."""
    probe = PromptEncoder(model, chat=False)
    encoder = PromptEncoder(model, chat=True) if getattr(probe.tokenizer, "chat_template", None) else probe
    encoded = []
    for number, prompt in enumerate(prompts, start=1):
        try:
            encoded.append(encoder(encoder.check(prompt, f"--prompt {number}")))
        except UsageError as exc:
            raise UsageError(f"--prompt {prompt!r}: {exc}") from None
    return encoded


async def sample_responses(engine: Any, prompts: Sequence[list[int]], max_new_tokens: int, temperature: float,
                           seed: int) -> list[ScoredSequence]:
    """One response per prompt from ``engine.generate`` (prompt ``i`` seeded ``seed + i``, no stop
    tokens: every response runs ``max_new_tokens`` tokens unless the engine ends it), as sequences."""
    outputs = await asyncio.gather(*(
        engine.generate(prompt, SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, seed=seed + i))
        for i, prompt in enumerate(prompts)))
    sequences = []
    for i, (prompt, output) in enumerate(zip(prompts, outputs, strict=True)):
        if not output.token_ids:
            continue
        sequences.append(ScoredSequence([*prompt, *output.token_ids], len(prompt), routing=output.routed_experts,
                                        origin=f"prompt {i + 1}"))
    if not sequences:
        raise UsageError("the engine returned an empty response to every prompt: nothing to score")
    return sequences


__all__ = ["DEFAULT_PROMPTS", "ScoredSequence", "encode_prompts", "read_sequences", "sample_responses"]
