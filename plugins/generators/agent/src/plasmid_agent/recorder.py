"""Turning a rollout's recorded model calls into trained samples (token in, token out).

The rule (see the README): each call's *parent* is the earlier call of the same rollout whose
prompt + completion token ids are the longest prefix of this call's prompt ids. A call continues
its parent's sample when it is the parent's first such child; any other call (no parent, or a
second child of one parent: a branch) starts a sample of its own, whose prompt is the call's whole
prompt. In a sample, the model's tokens have ``loss_mask`` 1 and the engine's log-probs; the ids
between one call's completion and the next call's completion (new user/tool messages, template
tokens) have ``loss_mask`` 0 and log-prob 0.0. Nothing is decoded and re-encoded.

Images: a call whose prompt held images records them (:attr:`Call.images`); a sample's images are
those of its last call (each call's images begin with its parent's), written as the reference
``{"images": [...]}`` under the metadata key the caller names, so that the trainer computes with the
pixels the engine saw; its image tokens are prompt tokens, or tool/user tokens with ``loss_mask`` 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from plasmid.types import Sample, Status


@dataclass
class Call:
    """One model call the gateway served: exactly what went into and came out of the engine.

    :ivar prompt_text: the text the prompt ids stand for (the rendered chat, or the completion
        prompt); with ``completion_text`` (the completion decoded in context) what a later call's
        text must start with to reuse these ids (see :mod:`plasmid_agent.gateway`).
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    status: Status
    weight_version: int
    prompt_text: str = ""
    completion_text: str = ""
    #: the prompt's images, in order, as portable image parts (:func:`plasmid_torch.vision.portable_part`)
    images: list[dict[str, Any]] = field(default_factory=list)

    @property
    def full_ids(self) -> list[int]:
        return self.prompt_ids + self.completion_ids


def parent_of(calls: Sequence[Call], position: int) -> int | None:
    """The parent of ``calls[position]``: the earlier call whose prompt + completion ids are the
    longest prefix of its prompt ids and whose images are the first of its images (an image's
    tokens are the same ids whatever the image), the latest one on a tie, or None."""
    prompt, images = calls[position].prompt_ids, calls[position].images
    best, best_length = None, -1
    for earlier in range(position):
        full = calls[earlier].full_ids
        if len(full) <= len(prompt) and len(full) >= best_length and prompt[:len(full)] == full \
                and images[:len(calls[earlier].images)] == calls[earlier].images:
            best, best_length = earlier, len(full)
    return best


def chains(calls: Sequence[Call]) -> list[list[int]]:
    """The calls (positions, in order) of each sample the rule of the module docstring makes."""
    result: list[list[int]] = []
    chain_of: dict[int, int] = {}
    continued: set[int] = set()
    for position in range(len(calls)):
        parent = parent_of(calls, position)
        if parent is not None and parent not in continued:
            continued.add(parent)
            chain_of[position] = chain_of[parent]
            result[chain_of[position]].append(position)
        else:
            chain_of[position] = len(result)
            result.append([position])
    return result


@dataclass
class RecordedSample:
    """A sample :func:`record_samples` built, and where its calls are in it.

    :ivar calls: the positions (in the rollout's call list) of the calls the sample holds, in order.
    :ivar offsets: for each of those calls, the response position (an index into ``sample.loss_mask``)
        where its completion starts; a call that produced no token has the position its completion
        would have had (the next call's offset, or ``response_length`` after the last).
    """

    sample: Sample
    calls: list[int]
    offsets: list[int]


def record_samples(template: Sample, calls: Sequence[Call], decode: Callable[[list[int]], str],
                   images_key: str | None = None) -> list[RecordedSample]:
    """One finished sample per chain of ``calls`` (see the module docstring), each a copy of
    ``template`` (prompt, label, metadata, index, group) with ``tokens``, ``response``,
    ``response_length``, ``loss_mask``, ``rollout_logprobs``, ``status`` (the last call's) and
    ``weight_version`` (the oldest call's) set, with the calls it holds and their completions'
    offsets. ``decode(ids)`` gives the response text. A chain whose calls produced no token at all
    makes no sample. With ``images_key``, ``metadata[images_key]`` is ``{"images": [...]}`` of the
    chain's last call, or absent when its calls had no images (whatever ``template`` held)."""
    recorded: list[RecordedSample] = []
    for chain in chains(calls):
        first = calls[chain[0]]
        tokens = list(first.full_ids)
        mask = [1] * len(first.completion_ids)
        logprobs = list(first.logprobs)
        offsets = [0]
        for position in chain[1:]:
            call = calls[position]
            between = call.prompt_ids[len(tokens):]
            offsets.append(len(tokens) + len(between) - len(first.prompt_ids))
            tokens += between + call.completion_ids
            mask += [0] * len(between) + [1] * len(call.completion_ids)
            logprobs += [0.0] * len(between) + list(call.logprobs)
        if not any(mask):
            continue
        response = tokens[len(first.prompt_ids):]
        metadata = dict(template.metadata)
        if images_key is not None:
            metadata.pop(images_key, None)
            if calls[chain[-1]].images:
                metadata[images_key] = {"images": [dict(part) for part in calls[chain[-1]].images]}
        sample = replace(
            template, tokens=tokens, response=decode(response), response_length=len(response), loss_mask=mask,
            rollout_logprobs=logprobs, status=calls[chain[-1]].status,
            weight_version=min(calls[p].weight_version for p in chain), metadata=metadata,
            reward=None, reward_components={},
        )
        recorded.append(RecordedSample(sample, list(chain), offsets))
    return recorded


def build_samples(template: Sample, calls: Sequence[Call], decode: Callable[[list[int]], str]) -> list[Sample]:
    """The samples of :func:`record_samples`, without where their calls are."""
    return [recorded.sample for recorded in record_samples(template, calls, decode)]
