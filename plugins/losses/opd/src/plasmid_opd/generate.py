"""``--generate opd``: the single-turn generation, each finished sample scored by the teacher."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from plasmid import providers
from plasmid.builtin import SingleTurn
from plasmid.config import Config
from plasmid.errors import UsageError
from plasmid.protocols import RolloutEngine, RolloutView
from plasmid.registry import Registry
from plasmid.types import Sample, SamplingParams, Status
from plasmid_opd.options import OPDOptions

#: ``Sample.metadata`` key of the teacher's log-probs of the sample's response tokens.
TEACHER_LOGPROBS_KEY = "teacher_logprobs"


#: Suffix of the options by which an engine attaches to running servers instead of starting its own
#: (``--sglang-external-addrs``, ``--vllm-external-addrs``): ``<engine>_external_addrs``.
EXTERNAL_ADDRS_SUFFIX = "_external_addrs"


def teacher_options(config: Config) -> argparse.Namespace:
    """The options the teacher engine is built with: the run's, except ``model`` (``--teacher-model``),
    ``engine`` (``--teacher-engine``, default the run's ``--engine``) and the external-address
    options: every ``<engine>_external_addrs`` is cleared, so the teacher never attaches to the
    student's servers, and ``--teacher-external-addrs``, when given, becomes the teacher engine's own.

    :raises UsageError: (one line) ``--teacher-model`` is not set; no engine is chosen;
        ``--teacher-external-addrs`` with a teacher engine that has no ``--<engine>-external-addrs``
        option, or naming a server the student attaches to.
    """
    opd = OPDOptions.of(config)
    if not opd.teacher_model:
        raise UsageError("--generate opd: --teacher-model is not set; give the teacher's model directory")
    engine = opd.teacher_engine or getattr(config.option, "engine", None)
    if not engine:
        raise UsageError("--generate opd: no engine serves the teacher; give --teacher-engine NAME (or --engine)")
    values = vars(config.option)
    student_servers = {name: _addresses(value) for name, value in values.items()
                       if name.endswith(EXTERNAL_ADDRS_SUFFIX) and name != "teacher_external_addrs" and value}
    options = {**values, "model": str(opd.teacher_model), "engine": engine,
               **dict.fromkeys(student_servers, None)}
    if opd.teacher_external_addrs:
        own = engine.replace("-", "_") + EXTERNAL_ADDRS_SUFFIX
        if own not in values:
            raise UsageError(f"--teacher-external-addrs: the teacher engine {engine!r} has no --{_flag(own)} option "
                             f"(it cannot attach to running servers); drop --teacher-external-addrs")
        for name, addresses in student_servers.items():
            shared = sorted(addresses & _addresses(opd.teacher_external_addrs))
            if shared:
                raise UsageError(f"--teacher-external-addrs {','.join(shared)} is also in --{_flag(name)}: the "
                                 f"teacher would score with the student's servers; give the teacher's own servers")
        options[own] = opd.teacher_external_addrs
    return argparse.Namespace(**options)


def _addresses(value: str) -> set[str]:
    return {address.strip() for address in str(value).split(",") if address.strip()}


def _flag(name: str) -> str:
    return name.replace("_", "-")


def teacher_factory(config: Config, registry: Registry | None = None) -> Callable[[], RolloutEngine]:
    """What builds the teacher: an engine of kind ``--teacher-engine`` with :func:`teacher_options`
    (so serving ``--teacher-model``, never on the student's servers). The engine provider is looked
    up now, from ``registry`` (default: the run's plugin lock, loaded in this process:
    :func:`plasmid.providers.find`), so an unknown ``--teacher-engine`` is a one-line error at
    start-up; the engine is built when the factory is called.
    """
    options = teacher_options(config)
    provider = providers.find("engine", options.engine, config, registry=registry,
                              flag="--teacher-engine" if OPDOptions.of(config).teacher_engine else None)
    teacher_config = replace(config, option=options)

    def build() -> RolloutEngine:
        engine: RolloutEngine = providers.instantiate(provider, teacher_config)
        return engine

    return build


def build_teacher(config: Config, registry: Registry | None = None) -> RolloutEngine:
    """The teacher engine, built now (:func:`teacher_factory`)."""
    return teacher_factory(config, registry)()


class OPDGenerate:
    """Generate as :class:`plasmid.builtin.SingleTurn` does, then let the teacher score the response.

    A finished (completed or truncated) sample gets ``metadata[TEACHER_LOGPROBS_KEY]``: the
    teacher engine's ``score(tokens, prompt_length, temperature)``, its log-probs of the response
    tokens at the sampling temperature (greedy requests at 1), aligned with ``rollout_logprobs``.
    The teacher engine is built on first use (:func:`teacher_factory`, whose engine kind is checked
    when this is built) and serves only ``score``.
    """

    def __init__(self, config: Config, teacher: Any = None) -> None:
        self.inner = SingleTurn(config)
        self._teacher = teacher
        #: builds the teacher on first use; its engine kind is checked now, at start-up
        self._build_teacher = teacher_factory(config) if teacher is None else None

    @property
    def teacher(self) -> RolloutEngine:
        """The teacher engine (built on first use)."""
        if self._teacher is None and self._build_teacher is not None:
            self._teacher = self._build_teacher()
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
