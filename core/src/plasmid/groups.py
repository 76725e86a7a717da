"""What data sources share: building prompt groups, groups as JSON state and back, and
:class:`GroupStream`, the numbering / given-back / resume logic of a stream of prompts."""

from __future__ import annotations

import copy
import dataclasses
import math
from collections import deque
from collections.abc import Sequence
from typing import Any

from plasmid.errors import DataExhausted
from plasmid.types import Group, Sample, Status

_SAMPLE_FIELDS = tuple(field.name for field in dataclasses.fields(Sample))


#: values shared between samples as they are: nothing in them can change
_ATOMIC = (str, int, float, bool, bytes, type(None))


def independent_copy(value: Any) -> Any:
    """A copy of ``value`` that shares nothing mutable with it, equal to ``copy.deepcopy(value)``
    and cheaper for the usual prompts, labels and metadata: atomic values (str, numbers, None)
    are returned as they are, a dict or list of atomic values is copied shallowly, anything
    else deeply (a data source builds every sample of every step with it)."""
    kind = type(value)
    if kind in _ATOMIC:
        return value
    if kind is dict:
        if all(type(v) in _ATOMIC for v in value.values()) and all(type(k) in _ATOMIC for k in value):
            return dict(value)
    elif kind is list and all(type(v) in _ATOMIC for v in value):
        return list(value)
    return copy.deepcopy(value)


def make_group(prompt: Any, tokens: list[int], label: Any, metadata: dict[str, Any], *, copies: int,
               first_sample_index: int, group_index: int) -> Group:
    """``copies`` independent samples of one prompt (nothing mutable is shared between them:
    :func:`independent_copy`), numbered ``first_sample_index, first_sample_index + 1, ...``, all in
    group ``group_index``."""
    samples = [
        Sample(prompt=independent_copy(prompt), tokens=list(tokens), label=independent_copy(label),
               metadata=independent_copy(metadata), index=first_sample_index + offset, group_index=group_index)
        for offset in range(copies)
    ]
    return Group(samples=samples, index=group_index)


def group_to_state(group: Group) -> dict[str, Any]:
    """The group as JSON-serialisable data (its samples' metadata and labels must be JSON)."""
    samples = []
    for sample in group.samples:
        state = {name: copy.deepcopy(getattr(sample, name)) for name in _SAMPLE_FIELDS}
        state["status"] = Status(sample.status).value
        samples.append(state)
    return {"index": group.index, "samples": samples}


def group_from_state(state: dict[str, Any]) -> Group:
    """The group that :func:`group_to_state` described."""
    samples = []
    for sample_state in state["samples"]:
        fields = {name: sample_state[name] for name in _SAMPLE_FIELDS if name in sample_state}
        fields["status"] = Status(fields.get("status", Status.PENDING))
        samples.append(Sample(**fields))
    return Group(samples=samples, index=state["index"])


class GroupStream:
    """Base of data sources that serve prompt groups from an ordered stream of prompts.

    It owns what every such source does the same way: given-back groups come out first,
    samples and groups are numbered by running counters, and that part of the state
    (epoch, position, counters, given-back groups) is saved and restored. A subclass supplies
    :meth:`next_prompt` (advancing ``epoch`` / ``position`` as it likes), and a finite source
    overrides :meth:`prompts_left` and :meth:`exhausted_message`.
    """

    def __init__(self, copies: int) -> None:
        self.copies = copies
        self.epoch = 0
        self.position = 0
        self.next_sample_index = 0
        self.next_group_index = 0
        self.given_back: deque[Group] = deque()

    def next_prompt(self) -> tuple[Any, list[int], Any, dict[str, Any]]:
        """The next training prompt as ``(prompt, tokens, label, metadata)``."""
        raise NotImplementedError

    def prompts_left(self) -> float:
        """New prompts the stream can still serve (``math.inf`` when endless)."""
        return math.inf

    def exhausted_message(self, left: float, needed: int) -> str:
        return f"{left} prompt(s) left, {needed} needed"

    def get_groups(self, n: int) -> list[Group]:
        """The next ``n`` groups: given-back groups first, then new prompts; raises
        :class:`~plasmid.errors.DataExhausted`, consuming nothing, when the stream runs short."""
        new_needed = max(0, n - len(self.given_back))
        left = self.prompts_left()
        if new_needed > left:
            raise DataExhausted(self.exhausted_message(left, new_needed))
        groups = [self.given_back.popleft() for _ in range(n - new_needed)]
        for _ in range(new_needed):
            groups.append(make_group(*self.next_prompt(), copies=self.copies,
                                     first_sample_index=self.next_sample_index, group_index=self.next_group_index))
            self.next_sample_index += self.copies
            self.next_group_index += 1
        return groups

    def add_groups(self, groups: Sequence[Group]) -> None:
        self.given_back.extend(groups)

    def stream_state(self) -> dict[str, Any]:
        """The stream's part of ``state_dict()`` (JSON-serialisable)."""
        return {"epoch": self.epoch, "position": self.position, "next_sample_index": self.next_sample_index,
                "next_group_index": self.next_group_index,
                "given_back": [group_to_state(group) for group in self.given_back]}

    def load_stream_state(self, state: dict[str, Any]) -> None:
        self.epoch, self.position = state["epoch"], state["position"]
        self.next_sample_index, self.next_group_index = state["next_sample_index"], state["next_group_index"]
        self.given_back = deque(group_from_state(group) for group in state["given_back"])
