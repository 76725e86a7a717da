"""The interfaces providers implement, one ``typing.Protocol`` per family.

Every family is registered as a *factory*: a callable that the kernel calls once, after
configuration, with the run's :class:`~plasmid.config.Config` (trainers also receive the chosen
:class:`Loss`), and that returns an object satisfying the family's protocol. A class whose
``__init__`` takes ``config`` is such a factory.

Methods that may cross a process boundary (engine, trainer, weight sync, rollout driver) are
``async`` and take and return plain data: token ids, numbers, numpy arrays or tensors, the
dataclasses of :mod:`plasmid.types`; never live objects such as a model or a tokenizer. That is
what lets the Ray runtime put any of them behind an actor without changing the caller.

Optional capabilities of a provider are small protocols of their own (:class:`SupportsStats`,
:class:`SupportsDiskWeights`, :class:`SupportsValues`, :class:`SupportsRestarts`,
:class:`SupportsPromptReport`, :class:`SupportsEosIds`; a loss's: :class:`SupportsMinSamples`,
:class:`SupportsOldLogprobsDeclaration`, :class:`SupportsReferenceScores`,
:class:`SupportsTrainingSamples`); callers test them with ``isinstance``, never with ``getattr``.
What a registration hook's ``register`` accepts is :class:`Register`.

This module imports only :mod:`plasmid.types` (and :mod:`plasmid.config` for type checking):
what a generate function or rollout driver sees of the run is the :class:`RolloutView`
protocol, which :class:`plasmid.context.RolloutContext` implements.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from plasmid.types import (
    GenerationOutput,
    Group,
    LossBatch,
    PromptReport,
    RewardParts,
    RolloutBatch,
    Sample,
    SamplingParams,
    SyncReport,
    Verdict,
)

if TYPE_CHECKING:
    from plasmid.config import Config

#: A named tensor in Hugging Face naming (``model.layers.0.self_attn.q_proj.weight``).
#: The tensor is a ``torch.Tensor`` or a ``numpy.ndarray``.
NamedTensor = tuple[str, Any]


@runtime_checkable
class Tokenizer(Protocol):
    """Text to token ids and back, for the rollout side (a Hugging Face tokenizer is one).

    ``encode(text, add_special_tokens=...)`` and ``decode(ids, skip_special_tokens=...)`` as in
    ``transformers``; ``apply_chat_template(messages, ...)`` where the model has a chat template.
    A tokenizer whose model ends sequences on more than ``eos_token_id`` also has ``eos_ids``
    (:class:`SupportsEosIds`, optional).
    """

    @property
    def eos_token_id(self) -> int | None: ...

    def encode(self, text: str, *args: Any, **kwargs: Any) -> list[int]:
        """The ids of ``text``. Callers pass ``add_special_tokens=False`` for a piece of a sequence
        (a tool answer, a label) and ``True`` for a whole prompt (BOS where the model wants it)."""
        ...

    def decode(self, token_ids: Sequence[int], *args: Any, **kwargs: Any) -> str:
        """The text of ``token_ids``: ``skip_special_tokens=True`` leaves EOS and other special tokens
        out (a sample's ``response``), ``False`` keeps them (parsing a turn for tool calls)."""
        ...


@runtime_checkable
class SupportsEosIds(Protocol):
    """A :class:`Tokenizer` that knows every id that ends a sequence of its model, not only
    ``eos_token_id``: Llama 3 style models list several (``<|eot_id|>``, ``<|end_of_text|>``, ...)
    in ``generation_config.json``. Optional, so third-party tokenizers written against
    :class:`Tokenizer` keep working: without it a run stops on ``eos_token_id`` alone
    (:func:`plasmid.stop_tokens.stop_token_ids`). The ``hf`` tokenizer has it.

    Named ``eos_ids``, not ``eos_token_ids``: a ``transformers`` tokenizer answers any attribute
    named ``<special token>_ids`` itself (``eos_token_ids`` would be the single EOS id), so the
    ``hf`` tokenizer could not carry a list under that name.

    :ivar eos_ids: the end-of-sequence ids, ``eos_token_id`` first, each once.
    """

    @property
    def eos_ids(self) -> Sequence[int]: ...


@runtime_checkable
class DataSource(Protocol):
    """Prompts, grouped: each :class:`Group` holds ``n_samples_per_prompt`` copies of a prompt.

    Samples come with ``prompt``, ``tokens`` (the prompt's token ids, chat template applied
    when the source uses one), ``label``, ``metadata``, a unique running ``index`` and the
    ``group_index`` of their group.
    """

    def get_groups(self, n: int) -> list[Group]:
        """The next ``n`` prompt groups of the training split (wrapping into a new epoch)."""
        ...

    def add_groups(self, groups: Sequence[Group]) -> None:
        """Take back groups that were not used (partial rollouts); they come out first next."""
        ...

    def eval_groups(self) -> list[Group]:
        """The whole evaluation split, one sample per group, in a fixed order."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume at exactly the next prompt (JSON-serialisable)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@runtime_checkable
class SupportsPromptReport(Protocol):
    """A data source that checked its prompts when it was built (tokenized every row, applied the
    run's :class:`plasmid.prompt_limits.PromptLimit`): the kernel prints what it found and logs
    ``data/dropped_overlong`` once (:func:`plasmid.prompt_limits.report_prompts`)."""

    @property
    def prompt_report(self) -> PromptReport: ...


@runtime_checkable
class RolloutEngine(Protocol):
    """Samples responses from a model; its weights are replaced after each training step.

    Optional: ``async generate_many(prompts: list[list[int]], params: list[SamplingParams]) ->
    list[GenerationOutput]``, the answers of ``generate(prompts[i], params[i])`` for every ``i``,
    in order, as if the calls ran concurrently, for callers with many requests at hand (a group's
    samples) without a task per request. Callers check for it with ``getattr``;
    :class:`plasmid.builtin.SingleTurn` uses it when every engine of the run has it, and otherwise
    makes one ``generate`` call per sample.

    Deprecated name: :meth:`response_logprobs` was called ``score``. An engine that still has only
    ``score`` keeps working: when the kernel builds it (:func:`plasmid.providers.instantiate`, which
    the runtimes, :func:`plasmid.providers.build` and :func:`plasmid.testing.build` use) its
    ``score`` is given the new name too, with a :class:`DeprecationWarning` naming the provider
    (:func:`plasmid.providers.adopt_legacy_score`). Rename the method; keep ``score = response_logprobs``
    as an alias while callers of yours still use the old name. The fallback goes with plugin API 2.
    """

    @property
    def weight_version(self) -> int:
        """Version of the weights being served; 0 before the first sync."""
        ...

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerationOutput:
        """Sample one response to ``prompt_ids``. Many calls run concurrently; engines batch."""
        ...

    async def response_logprobs(self, token_ids: list[int], prompt_length: int, temperature: float) -> list[float]:
        """Log-probs of ``token_ids[prompt_length:]`` given their prefix, under the served
        weights at ``temperature``; used to verify weight syncs (``[len - prompt_length]``).

        Named ``score`` before plugin API 1.1 (deprecated; see the class docstring)."""
        ...

    async def abort_all(self) -> int:
        """Finish every in-flight request now with ``Status.ABORTED``; returns how many."""
        ...

    async def update_weights(self, named_tensors: Iterable[NamedTensor], weight_version: int) -> None:
        """Load these tensors (Hugging Face names; a subset is allowed) and set the version."""
        ...

    async def get_weights(self, names: Sequence[str]) -> dict[str, Any]:
        """The served values of the named tensors (Hugging Face names) as numpy arrays,
        for verifying a weight sync bit for bit."""
        ...

    async def flush_cache(self) -> None:
        """Drop any cached prefixes computed with the old weights."""
        ...

    async def release_memory(self) -> None:
        """Free weights and KV cache memory (colocate mode, while the trainer runs)."""
        ...

    async def resume_memory(self) -> None: ...

    async def shutdown(self) -> None: ...


@runtime_checkable
class SupportsStats(Protocol):
    """An engine that counts its work: cumulative counters (``requests``, ``generated_tokens``,
    ``batches``, ``busy_seconds``, ...) that drivers and benchmarks diff between two readings."""

    def stats(self) -> dict[str, float]: ...


@runtime_checkable
class SupportsDiskWeights(Protocol):
    """An engine that loads a weight version from a directory of safetensors files itself (the
    disk sync then sends a path, not tensors)."""

    async def load_weights_from_disk(self, path: str, weight_version: int) -> None: ...


@runtime_checkable
class SupportsRestarts(Protocol):
    """An engine (or a runtime's proxy of one) that is restarted when it dies; ``restarts``
    counts how often, so a caller can re-sync weights into the restarted ones."""

    @property
    def restarts(self) -> int: ...


@runtime_checkable
class RolloutView(Protocol):
    """What a generate function and a rollout driver see of the run
    (:class:`plasmid.context.RolloutContext` implements it).

    :ivar engines: the rollout engines; a driver balances requests over them.
    :ivar data_source: the prompt source.
    :ivar tokenizer: text to ids and back, in this process.
    :ivar generate: the generate function.
    :ivar rewards: the weighted reward functions (:class:`plasmid.rewards.RewardSet`).
    :ivar filters: ``(name, filter)`` in the order given by ``--filter``.
    :ivar sampling: the training rollout's sampling parameters.
    :ivar tools: the ``--tools`` of the run, built once, by the name the model calls them
        (:attr:`Tool.name`), in the order given; empty without ``--tools``.
    :ivar aborting: set by the rollout driver when it aborts the step's in-flight work; the
        driver runs each step and each evaluation with a view of its own whose event is new and
        unset (so one step's abort never reaches another, or an evaluation). Generate functions
        read it (see :class:`GenerateFn`), never set it.
    """

    config: Config
    engines: Sequence[RolloutEngine]
    data_source: DataSource
    tokenizer: Tokenizer
    generate: GenerateFn
    rewards: Any
    filters: list[tuple[str, Filter]]
    sampling: SamplingParams
    tools: Mapping[str, Tool]
    aborting: asyncio.Event

    def engine_for(self, sample: Sample) -> RolloutEngine: ...

    def eval_sampling(self) -> SamplingParams: ...


class GenerateFn(Protocol):
    """Turns one prompt sample into one or more finished samples (multi-turn lives here).

    It must set ``tokens`` (prompt + response), ``response``, ``response_length``,
    ``loss_mask`` (0 on tokens the policy did not produce, e.g. tool output),
    ``rollout_logprobs``, ``status`` and ``weight_version``.

    Capabilities, declared as attributes of the factory (a class attribute):

    - ``takes_tools = True``: it calls the run's ``--tools`` (``ctx.tools``). Start-up refuses
      ``--tools`` with a generate function that does not declare it (the tools would never run).
    - ``carries_routed_experts = True``: it copies the engine's ``GenerationOutput.routed_experts``
      into ``metadata[ROUTED_EXPERTS_KEY]`` of its samples. Start-up refuses
      ``--return-routed-experts`` with a generate function that does not declare it.

    Optional: ``async generate_many(ctx, samples, params) -> list[Sample | list[Sample]]``, the
    results of calling it on ``(ctx, samples[i], params[i])`` for every ``i``, in order, run
    concurrently; the rollout driver then hands it a whole group in one call (the single-turn
    default has it, and batches the group's engine calls into one).

    Aborts: when the rollout driver aborts a step's in-flight work it first sets
    ``ctx.aborting`` (see :class:`RolloutView`), then aborts the engines (their outputs come back
    ``Status.ABORTED``), then, after a grace period, cancels what is still running. A generate
    function that awaits anything besides the engine (a tool, an environment) races that wait
    against ``ctx.aborting`` and, once it is set, starts no new engine request and returns the
    sample as it stands: ``status`` ``ABORTED``, the tokens, ``loss_mask`` and
    ``rollout_logprobs`` so far, and whatever it needs to continue in ``metadata`` (with
    ``--partial-rollout`` the driver gives it back later to be continued; otherwise it is reset to
    its prompt). One that ignores the event is cancelled and its sample reset to its prompt.
    """

    async def __call__(self, ctx: RolloutView, sample: Sample, params: SamplingParams) -> Sample | list[Sample]: ...


class RolloutDriver(Protocol):
    """Runs one rollout step: groups from the data source to scored, filtered groups."""

    async def run(self, ctx: RolloutView, rollout_id: int) -> RolloutBatch: ...

    async def evaluate(self, ctx: RolloutView, groups: list[Group], params: SamplingParams) -> dict[str, float]:
        """Generate one response per eval group with ``params`` and return metrics
        (at least ``eval/reward`` and ``eval/accuracy``, the fraction with reward >= 1)."""
        ...


class RewardFn(Protocol):
    """Scores one finished sample: a float, a dict of named floats (pick one with ``--reward-key``),
    or a :class:`plasmid.types.RewardParts` (the value with named parts that are logged, not added).

    An optional class attribute ``inline = True`` declares the call pure, bounded and
    synchronous: it is scored on the caller's thread with no worker and no timeout, and must
    return without awaiting (the ``plasmid_rewards`` hookspec has the contract).
    """

    async def __call__(self, sample: Sample) -> float | dict[str, float] | RewardParts: ...


class GroupRewardFn(Protocol):
    """Scores all samples of a group at once (a judge that compares responses).

    Marked by a class attribute ``group = True``; returns one value per sample, in order.
    ``inline = True`` may be declared as for :class:`RewardFn`.
    """

    group: bool

    async def __call__(self, samples: list[Sample]) -> list[float | dict[str, float] | RewardParts]: ...


class ToolError(Exception):
    """A tool call that failed in a way the model should be told about (bad arguments, no result).

    The generate loop shows ``str(error)`` to the model as the call's output; any other exception
    from a tool is reported the same way, with its type, and counted as a tool error.
    """


@runtime_checkable
class Tool(Protocol):
    """A function the policy may call during a multi-turn rollout (``--tools NAME,...``).

    Built once per run as ``factory(config)`` and called concurrently by many rollouts (keep no
    per-call state). The generate loop enforces the time limit and caps the output it appends;
    a tool need not, but must not block its event loop for long (run blocking work in a thread
    or a subprocess).

    :ivar name: what the model calls it (the name in its tool calls).
    :ivar description: one line the model is shown.
    :ivar parameters: JSON schema (``{"type": "object", "properties": ...}``) of its arguments,
        as in OpenAI function calling.
    """

    name: str
    description: str
    parameters: dict[str, Any]

    async def __call__(self, arguments: dict[str, Any], sample: Sample) -> str | list[dict[str, Any]]:
        """Run the call with the model's decoded ``arguments`` for the rollout of ``sample``
        (read its ``label``/``metadata``, never write them); the tool's answer appended to the
        conversation: text, or OpenAI content parts (``{"type": "text", "text": T}``, ``{"type":
        "image_url", "image_url": {"url": "data:image/png;base64,..."}}``) to show a vision-language
        policy images (appended as its image tokens, loss-masked like text; a text-only policy, or a
        format that appends text only, gets a tool error). Raise :class:`ToolError` for a failed call."""
        ...


class Filter(Protocol):
    """Decides whether a scored group is kept for training."""

    def __call__(self, group: Group) -> Verdict: ...


@runtime_checkable
class Loss(Protocol):
    """An RL algorithm: advantages from rewards, then a differentiable loss.

    Called by the trainer, in the trainer's process, on torch tensors (see :class:`LossBatch`).
    Per step the trainer fills ``old_logprobs`` (and ``ref_logprobs`` when ``needs_ref``,
    ``values`` when ``needs_critic``), calls :meth:`advantages` once on the whole batch, then
    :meth:`policy_loss` on each micro-batch and sums the gradients.

    A loss with ``needs_critic`` also implements :class:`CriticLoss`'s ``value_loss``; the
    trainer then owns a critic, passes its values before the update as ``LossBatch.values`` and
    trains it on ``value_loss`` every step.

    Optional capabilities, each a protocol of its own that trainers test with ``isinstance``:
    :class:`SupportsMinSamples`, :class:`SupportsOldLogprobsDeclaration`,
    :class:`SupportsReferenceScores`, :class:`SupportsTrainingSamples`.
    """

    needs_ref: bool
    needs_critic: bool
    needs_old_logprobs: bool

    def advantages(self, batch: LossBatch) -> tuple[Any, Any]:
        """``(advantages [B, T], returns [B, T] or None)`` for the whole step's batch."""
        ...

    def policy_loss(self, batch: LossBatch, logprobs: Any, entropy: Any) -> tuple[Any, dict[str, float]]:
        """A scalar loss with gradients through ``logprobs`` (``[B, T]``) and its metrics.

        ``batch`` is a micro-batch slice; normalise by ``batch.total_tokens`` /
        ``batch.total_samples`` so that summed micro-batch losses equal the full batch's.
        ``entropy`` is ``[B, T]`` (may be ``None`` when the loss does not use it).
        """
        ...


@runtime_checkable
class CriticLoss(Loss, Protocol):
    """A :class:`Loss` that trains a critic (``needs_critic`` is true): PPO and the like."""

    def value_loss(self, batch: LossBatch, values: Any) -> tuple[Any, dict[str, float]]:
        """A scalar loss with gradients through the critic's ``values`` (``[B, T]``) and its metrics.

        ``batch`` is a micro-batch slice with ``values`` (the critic's values before the update)
        and ``returns`` (the targets, from :meth:`Loss.advantages`) filled in; normalise like
        :meth:`Loss.policy_loss`, so that summed micro-batch losses equal the full batch's.
        """
        ...


@runtime_checkable
class SupportsMinSamples(Protocol):
    """A loss (its factory, a class attribute) that needs at least ``min_samples_per_prompt``
    samples per prompt (group-normalised advantages need 2); start-up checks
    ``--n-samples-per-prompt`` against it. Without it a loss needs 1."""

    min_samples_per_prompt: int


@runtime_checkable
class SupportsOldLogprobsDeclaration(Protocol):
    """A loss that says whether its :meth:`Loss.advantages` reads ``LossBatch.old_logprobs``.

    ``advantages_read_old_logprobs`` false lets a trainer skip the forward pass for the old
    log-probs when they are needed only by the policy loss of a single update (plasmid-torchtrain
    then takes them from the update's own forward pass). Without it a loss is taken to read them.
    """

    advantages_read_old_logprobs: bool


@runtime_checkable
class SupportsReferenceScores(Protocol):
    """A loss whose reference log-probs come from the samples, not from a reference model:
    ``reference_logprobs_key`` names the ``Sample.metadata`` key under which its generate function
    attaches them (plasmid-opd's teacher log-probs); the trainer fills ``LossBatch.ref_logprobs``
    from there. ``None`` means none (a trainer then uses its reference model when ``needs_ref``)."""

    reference_logprobs_key: str | None


@runtime_checkable
class SupportsTrainingSamples(Protocol):
    """A loss that picks the samples a step trains on: the trainer calls
    ``training_samples(samples, rollout_id=...)`` first, with the batch's samples and rollout id,
    and trains on what it returns (``--loss sft`` trains on demonstrations; ``sft-mix`` decides
    the kind of step by the rollout id)."""

    def training_samples(self, samples: Sequence[Sample], rollout_id: int = 0) -> list[Sample]: ...


#: Metric-name prefix of the reasons a trainer skipped a step (see :meth:`Trainer.train_step`).
BAD_STEP_PREFIX = "train/bad_step/"


@runtime_checkable
class Trainer(Protocol):
    """Owns the policy (and reference/critic when the loss needs them) and updates it.

    A trainer made of several processes (a multi-process runtime builds one per rank, in an
    initialised ``torch.distributed`` group) is one of two kinds:

    - *rank-0 reads* (the default): every rank holds the whole policy; collective calls
      (``train_step``, ``load``, ``offload``, ``onload``) go to every rank, the others
      (``logprobs``, ``values``, ``save``, ``export_weights``) to rank 0 alone.
    - *collective* (a class attribute ``collective = True``; megatron): the weights are sharded
      over the ranks, so **every** method, and every pass over :meth:`export_weights`, must run
      on every rank in the same order. The runtime then calls each on all ranks and uses rank 0's
      result; a weight sync that exports on rank 0 has the other ranks export alongside it.
    """

    async def logprobs(self, samples: list[Sample], temperature: float) -> list[list[float]]:
        """Log-probs of each sample's response tokens under the current policy."""
        ...

    async def train_step(self, batch: RolloutBatch) -> dict[str, float]:
        """One policy update on ``batch`` with the loss given at construction; its metrics.

        A step the trainer refuses to apply (a non-finite loss or gradient, weights that would
        blow up) leaves the weights and the optimizer state exactly as they were and reports why
        with metrics named ``BAD_STEP_PREFIX + reason`` (e.g. ``train/bad_step/nonfinite_grad_norm``,
        value 1.0); the loop logs it with the trainer's plugin and stops the run, with a checkpoint,
        after ``--max-bad-steps`` such steps in a row. A step that raises leaves the state unknown; a
        trainer whose ``save`` then writes its last finished step's state (or refuses) says so with
        ``saves_finished_step = True``, and the loop checkpoints that step with the failed batch.
        """
        ...

    def export_weights(self, bucket_bytes: int) -> Iterator[list[NamedTensor]]:
        """The policy's weights in Hugging Face names, in buckets of at most ``bucket_bytes``
        (a single tensor larger than that is a bucket of its own). Called in the trainer's process."""
        ...

    async def save(self, path: str) -> None:
        """Write a checkpoint directory: HF-format model, optimizer, RNG. Atomic for the caller."""
        ...

    async def load(self, path: str) -> None: ...

    async def offload(self) -> None: ...

    async def onload(self) -> None: ...


@runtime_checkable
class SupportsValues(Protocol):
    """A trainer that owns a critic (for a loss that ``needs_critic``)."""

    async def values(self, samples: list[Sample]) -> list[list[float]]:
        """The critic's value of each response token's state (``[response_length]`` each)."""
        ...


class WeightSync(Protocol):
    """Moves the trainer's weights into every engine and bumps their version."""

    async def sync(self, trainer: Trainer, engines: Sequence[RolloutEngine], weight_version: int) -> SyncReport: ...


@runtime_checkable
class SupportsSyncStart(Protocol):
    """A :class:`WeightSync` with set-up to do once the trainer and engines exist: the loop awaits
    ``start`` once, before the first rollout (after a ``--resume`` restored its checkpoint and
    before that checkpoint's weights are synced). Optional."""

    async def start(self, trainer: Trainer, engines: Sequence[RolloutEngine]) -> None: ...


@runtime_checkable
class SupportsSharedWeights(Protocol):
    """A trainer whose weights an engine in the same process may read in place (no copy).

    ``shared_weights()`` returns the live tensors the trainer updates in place, in Hugging Face
    names (each once: a tied ``lm_head`` is not repeated), or ``None`` when it cannot share them
    (sharded, LoRA's merged weights are computed, ...). The trainer promises to change them only
    in place (optimizer steps, a refused step's restore, a checkpoint's load), never to replace
    them, so an engine holding them sees every update as soon as it is made: a sync that shares
    them must only let engines generate when no train step runs (``--schedule sync``)."""

    def shared_weights(self) -> list[tuple[str, Any]] | None: ...


@runtime_checkable
class SupportsWeightSharing(Protocol):
    """An engine in the trainer's process that can serve the trainer's own tensors.

    ``share_weights(named_tensors, weight_version)`` serves each ``(name, tensor)`` itself in
    place of the engine's tensor of that name where dtype, device and shape agree (freeing the
    engine's copy), copies the others as ``update_weights`` would, and sets ``weight_version``;
    returns the bytes it now shares. Later calls with the same tensors copy nothing."""

    async def share_weights(self, named_tensors: Sequence[tuple[str, Any]], weight_version: int) -> int: ...


class Factory(Protocol):
    """What a registration hook registers: called once as ``factory(config)`` (trainers:
    ``factory(config, loss)``) to build the provider."""

    def __call__(self, config: Config, *args: Any) -> Any: ...


class Register(Protocol):
    """The ``register`` argument of every registration hook (:mod:`plasmid.hookspecs`):
    ``register(name, factory, *, default=False)``.

    :param name: how users select the provider (``--reward NAME``); unique within its family.
    :param factory: the provider's factory (a :class:`Factory`, such as a class whose
        ``__init__`` takes ``config``), or a ``"module:attr"`` string naming it, imported only when
        the provider is chosen.
    :param default: the provider to use when a one-provider family has several candidates and
        none was chosen.
    :param kind: only in ``plasmid_generators``, deprecated: ``kind="generate"`` registers a
        generate function there (use ``plasmid_generate_fns``).
    :raises PluginError: a name without text, or ``kind`` anywhere else.
    """

    def __call__(self, name: str, factory: Callable[..., Any] | str, *, default: bool = False,
                 kind: str | None = None) -> None: ...


__all__ = [
    "CriticLoss",
    "DataSource",
    "Factory",
    "Filter",
    "GenerateFn",
    "GroupRewardFn",
    "Loss",
    "NamedTensor",
    "Register",
    "RewardFn",
    "RolloutDriver",
    "RolloutEngine",
    "RolloutView",
    "SupportsDiskWeights",
    "SupportsEosIds",
    "SupportsMinSamples",
    "SupportsOldLogprobsDeclaration",
    "SupportsPromptReport",
    "SupportsReferenceScores",
    "SupportsRestarts",
    "SupportsStats",
    "SupportsTrainingSamples",
    "SupportsValues",
    "Tokenizer",
    "Tool",
    "ToolError",
    "Trainer",
    "WeightSync",
    "GenerationOutput",
]
