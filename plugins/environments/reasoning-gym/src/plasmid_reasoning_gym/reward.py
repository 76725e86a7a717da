"""The ``reasoning-gym`` reward: the entry's own dataset's ``score_answer`` on the extracted answer.

The sample's label (made by the ``reasoning-gym`` data source) names the dataset, its config and
the entry's index; the reward rebuilds that exact entry (one dataset instance per config, shared)
and returns ``float(dataset.score_answer(answer, entry))``, where ``answer`` is, by
``--rg-answer-format``:

- ``tags`` (default): reasoning-gym's own ``extract_answer(response, tag_name=--rg-answer-tag)``,
  the last ``<answer>...</answer>`` with surrounding whitespace stripped; ``None`` (which every
  reasoning-gym scorer scores 0) when there is no such tag;
- ``last-line``: the last non-empty line, stripped (``None`` for an empty response);
- ``none``: the whole response.

A label that is not a reasoning-gym entry fails the sample for this reward (one line; see
``--reward-errors``). Calls keep no per-call state, so concurrent calls are safe; scorers are
CPU-cheap and run on the reward's worker loop.
"""

from __future__ import annotations

from typing import Any, ClassVar

from plasmid.config import Config
from plasmid.options import Options
from plasmid.types import Sample
from plasmid_reasoning_gym import gym
from plasmid_reasoning_gym.mixture import entry_of_label
from plasmid_reasoning_gym.options import ReasoningGymOptions


def extract(response: str, answer_format: str, tag: str = "answer") -> str | None:
    """The answer that ``--rg-answer-format answer_format`` takes from ``response``."""
    if answer_format == "tags":
        from reasoning_gym.utils import extract_answer

        found: str | None = extract_answer(response, tag_name=tag)
        return found
    if answer_format == "last-line":
        lines = [line.strip() for line in response.splitlines() if line.strip()]
        return lines[-1] if lines else None
    if answer_format == "none":
        return response
    raise ValueError(f"unknown answer format {answer_format!r}")


class ReasoningGymReward:
    """A :class:`plasmid.protocols.RewardFn` scoring with reasoning-gym's own scorers (module docstring)."""

    option_classes: ClassVar[tuple[type[Options], ...]] = (ReasoningGymOptions,)

    def __init__(self, config: Config) -> None:
        gym.check_version()
        options = ReasoningGymOptions.of(config)
        self.answer_format, self.tag = options.rg_answer_format, options.rg_answer_tag

    def score(self, response: str, label: Any) -> float:
        """The score of ``response`` for the entry that ``label`` names."""
        dataset, entry = entry_of_label(label)
        return float(dataset.score_answer(extract(response, self.answer_format, self.tag), entry))

    async def __call__(self, sample: Sample) -> float:
        return self.score(sample.response, sample.label)
