"""Reading a sample's label as the list of answers that count as correct."""

from __future__ import annotations

import numbers
from typing import Any

from plasmid.types import Sample


class MissingLabelError(ValueError):
    """A sample reached a match reward without a label."""


def acceptable_answers(sample: Sample, reward_name: str) -> list[str]:
    """The label of ``sample`` as a non-empty list of strings.

    A string is one answer; a list or tuple holds several, any of which is correct; numbers
    stand for their text (``7`` for ``"7"``). Anything else is a ``TypeError``; a missing label
    (``None``) or an empty list is a :class:`MissingLabelError` that says how to provide one.
    """
    label = sample.label
    if label is None:
        raise MissingLabelError(
            f"reward '{reward_name}' (plasmid-match) got sample {sample.index} without a label: the data source "
            f"gave none. Tell the data source which field holds the answer (for file data sources: "
            f"--label-key FIELD), or choose a reward that needs no label"
        )
    answers = list(label) if isinstance(label, (list, tuple)) else [label]
    if not answers:
        raise MissingLabelError(
            f"reward '{reward_name}' (plasmid-match) got sample {sample.index} whose label is an empty list; "
            f"give at least one acceptable answer"
        )
    return [_as_text(answer, reward_name) for answer in answers]


def _as_text(answer: Any, reward_name: str) -> str:
    if isinstance(answer, str):
        return answer
    if isinstance(answer, numbers.Number) and not isinstance(answer, bool):
        return str(answer)
    raise TypeError(
        f"reward '{reward_name}' (plasmid-match) compares text, but an answer in the label is "
        f"{type(answer).__name__} {answer!r}; labels are a string, a number, or a list of them"
    )
