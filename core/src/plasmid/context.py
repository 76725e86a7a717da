"""What a rollout driver and a generate function work with, assembled once per run."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from plasmid.config import Config
from plasmid.kernel_options import EvalOptions, GeneralOptions
from plasmid.protocols import DataSource, Filter, GenerateFn, RolloutEngine, Tokenizer, Tool
from plasmid.rewards import RewardSet
from plasmid.types import Sample, SamplingParams


@dataclass
class RolloutContext:
    """The rollout side of a run, built once per process by
    :func:`plasmid.session.build_rollout_context`; its fields are those of the
    :class:`plasmid.protocols.RolloutView` protocol it implements, documented there."""

    config: Config
    engines: Sequence[RolloutEngine]
    data_source: DataSource
    tokenizer: Tokenizer
    generate: GenerateFn
    rewards: RewardSet
    filters: list[tuple[str, Filter]] = field(default_factory=list)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    tools: Mapping[str, Tool] = field(default_factory=dict)
    aborting: asyncio.Event = field(default_factory=asyncio.Event)

    def engine_for(self, sample: Sample) -> RolloutEngine:
        """The engine that serves ``sample``: round-robin by group, so a group shares one
        engine (and its prefix cache)."""
        return self.engines[sample.group_index % len(self.engines)]

    def eval_sampling(self) -> SamplingParams:
        """The sampling parameters of evaluation: ``--eval-temperature`` (greedy by default)."""
        return SamplingParams(
            temperature=EvalOptions.of(self.config).eval_temperature,
            max_new_tokens=self.sampling.max_new_tokens,
            stop_token_ids=self.sampling.stop_token_ids,
            seed=GeneralOptions.of(self.config).seed,
        )
