"""Building prompt groups, and turning groups into JSON state and back (for given-back groups).

Used by data sources (prompt groups, resumable given-back groups)."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from plasmid.types import Group, Sample, Status

_SAMPLE_FIELDS = tuple(field.name for field in dataclasses.fields(Sample))


def make_group(prompt: Any, tokens: list[int], label: Any, metadata: dict[str, Any], *, copies: int,
               first_sample_index: int, group_index: int) -> Group:
    """``copies`` independent samples of one prompt (nothing mutable is shared between them),
    numbered ``first_sample_index, first_sample_index + 1, ...``, all in group ``group_index``."""
    samples = [
        Sample(prompt=copy.deepcopy(prompt), tokens=list(tokens), label=copy.deepcopy(label),
               metadata=copy.deepcopy(metadata), index=first_sample_index + offset, group_index=group_index)
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
