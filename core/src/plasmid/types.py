"""The data that flows between providers.

Everything here is plain data (ints, floats, strings, lists, dicts, numpy arrays) so that it can
cross a process boundary (a Ray actor) by pickling. Token ids are ``list[int]``; per-token values
are ``list[float]`` aligned with the response tokens.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any


class Status(enum.StrEnum):
    """Where a sample is in its life. ``TRUNCATED`` means it hit ``max_new_tokens``."""

    PENDING = "pending"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED = "failed"


@dataclass(frozen=True)
class SamplingParams:
    """How an engine samples one response.

    ``top_k <= 0`` and ``top_p >= 1`` disable those filters; ``temperature == 0`` is greedy.
    With both, a token is kept when it is among the ``top_k`` likeliest *and* the probability
    mass of the tokens likelier than it is below ``top_p`` (SGLang's rule).
    ``stop_token_ids`` end a response (the stop token is kept in the response); so does ``stop``, a string
    in the decoded response (special tokens skipped): the tokens kept run through the one completing it.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass
class GenerationOutput:
    """What an engine returns for one request.

    :ivar token_ids: the generated response tokens (``[response_length]``).
    :ivar logprobs: log-probability of each generated token under the engine's sampling
        distribution at ``temperature`` (before top-p/top-k truncation), natural log; greedy
        requests (temperature 0) report log-probs at temperature 1.
    :ivar status: ``COMPLETED`` (stop token), ``TRUNCATED`` (length) or ``ABORTED``.
    :ivar weight_version: the engine's weight version when the request finished.
    :ivar routed_experts: the mixture-of-experts routing of ``prompt_ids + token_ids`` in the
        :data:`ROUTED_EXPERTS_KEY` format (the last generated token, never fed to the model, left
        out), when the engine was asked for it (``--return-routed-experts``); ``None`` otherwise.
    """

    token_ids: list[int]
    logprobs: list[float]
    status: Status
    weight_version: int
    routed_experts: list[list[list[int]]] | None = None


#: ``Sample.metadata`` key naming the part of a mixture a prompt came from (a dataset's name):
#: set by data sources that mix, it makes the rollout driver log reward and accuracy per part.
SUBSET_KEY = "subset"

#: ``Sample.metadata`` key of the rollout engine's mixture-of-experts routing, when the engine
#: reports it: a list with one entry per token of ``tokens`` (the last may be left out: it predicts
#: nothing), each a list per MoE layer of the ``top_k`` expert indices (ints) that token was routed
#: to. A trainer may replay it (the megatron trainer's ``--routing-replay r3``).
ROUTED_EXPERTS_KEY = "routed_experts"


@dataclass
class Sample:
    """One prompt and one response, with everything the trainer needs.

    ``tokens`` holds prompt and response ids; the response is its last ``response_length``
    tokens. ``loss_mask`` and ``rollout_logprobs`` are aligned with the response tokens.
    ``metadata`` is free-form; :data:`SUBSET_KEY` and :data:`ROUTED_EXPERTS_KEY` have a meaning
    there.
    """

    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    loss_mask: list[int] | None = None
    rollout_logprobs: list[float] | None = None
    reward: float | None = None
    reward_components: dict[str, float] = field(default_factory=dict)
    label: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)
    status: Status = Status.PENDING
    weight_version: int | None = None
    index: int = 0
    group_index: int = 0

    @property
    def prompt_length(self) -> int:
        return len(self.tokens) - self.response_length

    @property
    def prompt_tokens(self) -> list[int]:
        return self.tokens[: self.prompt_length]

    @property
    def response_tokens(self) -> list[int]:
        return self.tokens[self.prompt_length :]


@dataclass
class Group:
    """The ``n`` samples drawn for one prompt. Group-relative algorithms normalise within it."""

    samples: list[Sample]
    index: int = 0

    @property
    def rewards(self) -> list[float]:
        return [s.reward if s.reward is not None else math.nan for s in self.samples]


@dataclass
class RolloutBatch:
    """The groups that one rollout step produced, and what the driver measured doing so."""

    rollout_id: int
    groups: list[Group]
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def samples(self) -> list[Sample]:
        return [s for g in self.groups for s in g.samples]


@dataclass(frozen=True)
class PromptReport:
    """What a data source found in its prompts at start-up (:mod:`plasmid.prompt_limits`).

    :ivar data: what gave the prompts, for messages (``--prompt-data rows.jsonl``).
    :ivar rows: prompts checked (training and evaluation).
    :ivar dropped_overlong: prompts dropped as longer than ``--max-prompt-length``.
    :ivar limit: the limit applied, as messages name it (``--max-prompt-length 56 (...)``); ``""``
        when none was (the source has no limit to apply, or the model names no context).
    :ivar first_dropped: where the first dropped prompt is and its length, for messages.
    :ivar chat_template_flag: when the prompts were encoded as plain text with a tokenizer that
        has a chat template, the flag that would apply it (``--apply-chat-template``); else ``""``.
    """

    data: str
    rows: int
    dropped_overlong: int = 0
    limit: str = ""
    first_dropped: str = ""
    chat_template_flag: str = ""


@dataclass(frozen=True)
class RewardParts:
    """What a reward may return instead of a float: its ``value`` and the named ``parts`` that
    explain it (a rubric's functions, a judge's criteria).

    ``value`` is the reward (weighted and summed as a float would be). Each part is kept in
    ``Sample.reward_components`` as ``"<reward>.<part>"`` and so logged as
    ``rollout/reward/<reward>.<part>``; parts are never added to the sample's reward, and a
    non-finite or non-numeric part is left out.
    """

    value: float
    parts: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    """A filter's decision on a group; ``reason`` names why it was dropped (counted in metrics)."""

    keep: bool
    reason: str = ""


@dataclass
class SyncReport:
    """What one weight sync moved: ``bytes`` of tensor data in ``seconds`` of wall clock.

    ``metrics``: anything else the sync measured (``sync/...`` names, e.g. a compressing sync's
    ``sync/raw_bytes`` and ``sync/bytes_saved``); the loop logs them with the step's metrics.
    """

    bytes: int
    seconds: float
    weight_version: int
    buckets: int = 0
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class LossBatch:
    """The tensors a loss sees for a batch (or a micro-batch slice of it); built by the trainer.

    ``B`` is samples, ``T`` the padded response length. All per-token tensors are float32
    ``[B, T]`` aligned with the response tokens; padding and masked tokens have
    ``response_mask == 0`` and must not contribute to any loss or metric.

    :ivar rewards: ``[B]`` scalar reward per sample.
    :ivar group_index: ``[B]`` int64, samples of one prompt share a value.
    :ivar response_mask: ``[B, T]`` 1.0 where a token is trained on (the sample's ``loss_mask``).
    :ivar old_logprobs: ``[B, T]`` log-probs under the policy that the batch is trained from
        (computed by the trainer before the first update), or the rollout's when not needed.
    :ivar ref_logprobs: ``[B, T]`` log-probs under the frozen reference, when ``needs_ref``.
    :ivar rollout_logprobs: ``[B, T]`` log-probs reported by the engine, when it reported them.
    :ivar values: ``[B, T]`` critic values before the update, when ``needs_critic``.
    :ivar advantages: ``[B, T]``, filled in from ``Loss.advantages``.
    :ivar returns: ``[B, T]`` value targets, filled in from ``Loss.advantages`` (critic losses).
    :ivar total_tokens: trained tokens in the whole step (all micro-batches): the normaliser
        of token-mean aggregation, so that accumulated gradients equal one big batch's.
    :ivar total_samples: samples in the whole step, the normaliser of sequence-mean losses.
    """

    rewards: Any
    group_index: Any
    response_mask: Any
    old_logprobs: Any
    ref_logprobs: Any = None
    rollout_logprobs: Any = None
    values: Any = None
    advantages: Any = None
    returns: Any = None
    total_tokens: int = 0
    total_samples: int = 0

    def select(self, index: Any) -> LossBatch:
        """The rows ``index`` (a slice or index tensor) of every tensor; totals are kept."""
        picked = {
            name: (value[index] if value is not None and hasattr(value, "shape") else value)
            for name, value in self.__dict__.items()
        }
        return LossBatch(**picked)
