"""``--generate opd``: the single-turn generation, each finished sample scored by the teacher."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from plasmid.builtin import SingleTurn
from plasmid.config import Config
from plasmid.errors import UsageError
from plasmid.plugins import PluginManager
from plasmid.protocols import RolloutEngine, RolloutView
from plasmid.registry import Registry
from plasmid.session import instantiate
from plasmid.types import Sample, SamplingParams, Status
from plasmid_opd.options import OPDOptions

#: ``Sample.metadata`` key of the teacher's log-probs of the sample's response tokens.
TEACHER_LOGPROBS_KEY = "teacher_logprobs"


def build_teacher(config: Config, registry: Registry | None = None) -> RolloutEngine:
    """An engine of the run's ``--engine`` kind serving ``--teacher-model``, its other options
    unchanged; the engine provider comes from ``registry`` (default: the run's plugin lock,
    loaded in this process)."""
    teacher = OPDOptions.of(config).teacher_model
    if not teacher:
        raise UsageError("--generate opd: --teacher-model is not set; give the teacher's model directory")
    if registry is None:
        manager = PluginManager()
        manager.load_lock(config.plugin_lock)
        registry = Registry.collect(manager)
    options = argparse.Namespace(**{**vars(config.option), "model": str(teacher)})
    engine: RolloutEngine = instantiate(registry.get("engine", config.option.engine), replace(config, option=options))
    return engine


class OPDGenerate:
    """Generate as :class:`plasmid.builtin.SingleTurn` does, then let the teacher score the response.

    A finished (completed or truncated) sample gets ``metadata[TEACHER_LOGPROBS_KEY]``: the
    teacher engine's ``score(tokens, prompt_length, temperature)``, its log-probs of the response
    tokens at the sampling temperature (greedy requests at 1), aligned with ``rollout_logprobs``.
    The teacher engine is built on first use (:func:`build_teacher`) and serves only ``score``.
    """

    def __init__(self, config: Config, teacher: Any = None) -> None:
        self.config = config
        self.inner = SingleTurn(config)
        self._teacher = teacher

    @property
    def teacher(self) -> RolloutEngine:
        """The teacher engine (built on first use)."""
        if self._teacher is None:
            self._teacher = build_teacher(self.config)
        teacher: RolloutEngine = self._teacher
        return teacher

    async def __call__(self, ctx: RolloutView, sample: Sample, params: SamplingParams) -> Sample:
        finished = await self.inner(ctx, sample, params)
        if finished.status in (Status.COMPLETED, Status.TRUNCATED) and finished.response_length > 0:
            scores = await self.teacher.score(list(finished.tokens), finished.prompt_length,
                                              params.temperature or 1.0)
            if len(scores) != finished.response_length:
                raise ValueError(f"--generate opd: the teacher scored {len(scores)} tokens of sample "
                                 f"{finished.index}'s {finished.response_length}-token response")
            finished.metadata[TEACHER_LOGPROBS_KEY] = [float(value) for value in scores]
        return finished
