"""MoE routing replay for the megatron trainer: record each router's top-k expert choices in one
forward pass and make a later pass route the same tokens to the same experts.

A later pass of the same step (after an optimizer update, or with another micro-batch layout)
can flip near-tie routing decisions, and a flipped token's log-prob jumps by far more than the
weights moved; replaying the recorded choices keeps the experts fixed, so only the gate
probabilities (recomputed from the current router logits at the recorded experts) and the
experts' weights change. R2 replays the trainer's own first pass; R3 replays choices the rollout
engine reported (same layout: per MoE layer, ``[tokens, top_k]`` expert indices in the order the
router sees the tokens, sequence-major ``[s, b]`` flattened).

Built on megatron-core's own ``RouterReplay`` (``moe_enable_routing_replay``, which each
``TopKRouter`` consults in ``topk_routing_with_score_function``); this module drives the
instances of ONE model (megatron keeps a process-global list of every router ever built, which
would mix models in one process). Only forward replay is used: the trainer does not recompute
activations, so the backward pass never re-runs routing.

Per-sample routing (:func:`split_by_sample`, :func:`pack_for`) carries the choices from one
micro-batch layout to another (R2: the old-log-prob pass packs all rows, an update only its
chunk) and is the form an engine would report them in (R3): ``[sequence_length, layers, top_k]``
per sample, every token of prompt and response.

In the trainer (``--routing-replay``, :class:`StepRouting`): with ``r2`` the step's
old-log-prob pass records every sample's choices and each update's micro-batches replay them (a
step without that pass, a loss that trains on the rollout's log-probs, routes freely); with ``r3``
every pass of the step (old log-probs and updates) replays the engine's choices, read from each
sample's ``metadata[plasmid.types.ROUTED_EXPERTS_KEY]`` (torchgen and SGLang fill it with
``--return-routed-experts``, which ``r3`` turns on); a micro-batch with a sample that has none
routes freely. Tensor, pipeline and context parallelism are refused by the trainer (on a CPU,
megatron's MoE layers cannot run tensor-parallel at all: they need TransformerEngine's sequence
parallelism); data and expert parallelism replay each rank's own rows (:class:`StepRouting`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch

from plasmid.types import ROUTED_EXPERTS_KEY

#: ``TransformerConfig`` fields that make every router of a model replayable.
CONFIG_KWARGS = {"moe_enable_routing_replay": True}


def replay_instances(model: Any) -> list[Any]:
    """The ``RouterReplay`` of each MoE layer of ``model`` (a ``GPTModel``, DDP-wrapped or not),
    in layer order; ``ValueError`` when the model has routers built without
    ``moe_enable_routing_replay`` (:data:`CONFIG_KWARGS`); empty for a dense model."""
    from megatron.core.transformer.moe.router import TopKRouter

    routers = [module for module in model.modules() if isinstance(module, TopKRouter)]
    missing = [position for position, router in enumerate(routers) if router.router_replay is None]
    if missing:
        raise ValueError(f"routing replay: the model's routers {missing} were built without "
                         f"moe_enable_routing_replay (TransformerConfig); build it with {CONFIG_KWARGS}")
    return [router.router_replay for router in routers]


@contextmanager
def recording(model: Any) -> Iterator[list[torch.Tensor]]:
    """Record the forward passes run inside the block; the yielded list is filled on exit with
    each MoE layer's ``[tokens, top_k]`` int64 expert indices of the LAST pass (CPU copies)."""
    from megatron.core.transformer.moe.router_replay import RouterReplayAction

    instances = replay_instances(model)
    recorded: list[torch.Tensor] = []
    for instance in instances:
        instance.clear_indices()
        instance.set_router_replay_action(RouterReplayAction.RECORD)
    try:
        yield recorded
    finally:
        for position, instance in enumerate(instances):
            indices = instance.get_recorded_indices()
            instance.clear_router_replay_action()
            instance.clear_indices()
            if indices is None:
                raise ValueError(f"routing replay: MoE layer {position} routed no tokens while recording")
            recorded.append(indices.detach().to("cpu", torch.int64).clone())


@contextmanager
def replaying(model: Any, indices: Sequence[torch.Tensor]) -> Iterator[None]:
    """Run the forward passes inside the block with each MoE layer routing to ``indices`` (one
    ``[tokens, top_k]`` tensor per layer, as :func:`recording` yields them or an engine reports
    them); ``ValueError`` when the count of layers or the top-k does not match the model."""
    from megatron.core.transformer.moe.router_replay import RouterReplayAction

    instances = replay_instances(model)
    if len(indices) != len(instances):
        raise ValueError(f"routing replay: {len(indices)} layers of expert indices for a model with "
                         f"{len(instances)} MoE layers")
    routers = _routers(model)
    for position, (layer, router) in enumerate(zip(indices, routers, strict=True)):
        if layer.dim() != 2 or layer.shape[1] != router.topk:
            raise ValueError(f"routing replay: MoE layer {position} expects [tokens, {router.topk}] expert indices, "
                             f"got shape {list(layer.shape)}")
    for instance, layer in zip(instances, indices, strict=True):
        instance.clear_indices()
        instance.set_target_indices(layer.to(torch.int64))
        instance.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
    try:
        yield
    finally:
        for instance in instances:
            instance.clear_router_replay_action()
            instance.clear_indices()


def split_by_sample(recorded: Sequence[torch.Tensor], input_ids: torch.Tensor, rows: Sequence[int],
                    lengths: Sequence[int]) -> dict[int, torch.Tensor]:
    """``{row: [length, layers, top_k]}``: one micro-batch's recorded choices (per layer
    ``[s * b, top_k]``, sequence-major as the router sees the ``[s, b]`` tokens) cut per sample.

    :param input_ids: the micro-batch's ``[b, s]`` right-padded ids (no context parallelism).
    :param rows: ``[b]`` the samples' rows; ``lengths``: each sample's unpadded token count."""
    batch, width = input_ids.shape
    stacked = torch.stack([layer.view(width, batch, -1) for layer in recorded], dim=2)      # [s, b, layers, k]
    return {int(row): stacked[:length, column].clone()
            for column, (row, length) in enumerate(zip(rows, lengths, strict=True))}


def pack_for(per_sample: dict[int, torch.Tensor], input_ids: torch.Tensor, rows: Sequence[int]) -> list[torch.Tensor]:
    """Per layer ``[s * b, top_k]`` targets of a micro-batch (``[b, s]`` ``input_ids`` of the
    samples ``rows``) from :func:`split_by_sample`'s per-sample choices; padding positions route to
    experts ``0 .. top_k - 1`` (right padding: no real token attends to them). ``ValueError`` when
    a sample has no recorded choices or they are longer than the micro-batch."""
    batch, width = input_ids.shape
    missing = [int(row) for row in rows if int(row) not in per_sample]
    if missing:
        raise ValueError(f"routing replay: no recorded expert choices for the samples at rows {missing}")
    first = per_sample[int(rows[0])]
    layers, top_k = first.shape[1], first.shape[2]
    packed = torch.arange(top_k, dtype=torch.int64).expand(width, batch, layers, top_k).clone()
    for column, row in enumerate(rows):
        choices = per_sample[int(row)]
        if choices.shape[0] > width or choices.shape[1:] != (layers, top_k):
            raise ValueError(f"routing replay: sample at row {int(row)} has expert choices of shape "
                             f"{list(choices.shape)} for a micro-batch of {width} positions, {layers} layers, "
                             f"top-{top_k}")
        packed[:choices.shape[0], column] = choices
    return [packed[:, :, layer].reshape(width * batch, top_k) for layer in range(layers)]


def engine_routing(samples: Sequence[Any]) -> dict[int, torch.Tensor]:
    """``{row: [length, layers, top_k]}`` from the samples' ``metadata[ROUTED_EXPERTS_KEY]``
    (those without it are left out); a missing last token's entry is filled with experts
    ``0 .. top_k - 1`` (its output predicts nothing). ``ValueError`` naming the sample when the
    entry count is not ``len(tokens)`` or ``len(tokens) - 1`` or the entries are not ``[layers][top_k]``."""
    found: dict[int, torch.Tensor] = {}
    for row, sample in enumerate(samples):
        routed = sample.metadata.get(ROUTED_EXPERTS_KEY)
        if routed is None:
            continue
        where = f"sample {row} (index {sample.index}): metadata[{ROUTED_EXPERTS_KEY!r}]"
        try:
            choices = torch.tensor(routed, dtype=torch.int64)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where} is not a [tokens][layers][top_k] list of ints: {exc}") from None
        length = len(sample.tokens)
        if choices.dim() != 3 or choices.shape[0] not in (length, length - 1):
            raise ValueError(f"{where} has shape {list(choices.shape)}; expected [{length} or {length - 1} tokens, "
                             f"layers, top_k]")
        if choices.shape[0] == length - 1:
            last = torch.arange(choices.shape[2], dtype=torch.int64).expand(1, choices.shape[1], -1)
            choices = torch.cat([choices, last])
        found[row] = choices
    return found


class StepRouting:
    """``--routing-replay`` for one trainer: the step's per-sample expert choices (R2: recorded
    in its old-log-prob pass; R3: the engine's, from the samples) replayed in its passes.

    :meth:`recording_pass` starts a step (forgets the previous one's choices, remembers which
    samples list it records); :meth:`record` and :meth:`replay` are the per-micro-batch contexts
    of the old-log-prob pass and of the updates. An update of another samples list than the one
    recorded (no old-log-prob pass this step) routes freely; ``replayed`` and ``free`` count the
    micro-batches of each kind (for tests and diagnostics).

    Data (and expert) parallelism: every rank routes its own micro-batches' tokens (the routers
    run before the experts' all-to-all), so each replays the choices of its own rows. R3 reads every
    sample's engine routing on every rank; R2's recorded choices are exchanged over ``dp_group``
    (``dp_size`` ranks) at the step's first replayed micro-batch, since an update's rows need not be
    on the rank that recorded them (every rank takes part: each runs at least one micro-batch).
    """

    def __init__(self, model: Any, mode: str = "r2", dp_group: object = None, dp_size: int = 1) -> None:
        if mode not in ("r2", "r3"):
            raise ValueError(f"routing replay: unknown mode {mode!r} (r2, r3)")
        self.model = model
        self.mode = mode
        replay_instances(model)                        # refuses a model built without replay
        self.dp_group, self.dp_size = dp_group, dp_size
        self.per_sample: dict[int, torch.Tensor] = {}
        self._samples: object = None
        self._shared = True                            # R2 under data parallelism: exchanged this step yet
        self.replayed = 0
        self.free = 0

    def recording_pass(self, samples: Sequence[Any]) -> None:
        """The old-log-prob pass of a new step over ``samples`` starts (R3: their choices are read)."""
        self.per_sample = engine_routing(samples) if self.mode == "r3" else {}
        self._samples = samples
        self._shared = self.mode == "r3" or self.dp_size == 1

    def old_pass(self, micro: Any, lengths: Sequence[int]) -> AbstractContextManager[None]:
        """The old-log-prob pass's context for ``micro``: R2 records, R3 replays the engine's choices."""
        if self.mode == "r3":
            return self.replay(micro, self._samples)
        return self.record(micro, lengths)

    @contextmanager
    def record(self, micro: Any, lengths: Sequence[int]) -> Iterator[None]:
        """Record ``micro``'s forward (``lengths``: every step sample's token count)."""
        with recording(self.model) as recorded:
            yield
        if micro.counts:
            rows = [int(row) for row in micro.rows]
            self.per_sample.update(split_by_sample(recorded, micro.input_ids.cpu(), rows,
                                                   [lengths[row] for row in rows]))

    @contextmanager
    def replay(self, micro: Any, samples: object) -> Iterator[None]:
        """Route ``micro``'s forward as recorded when ``samples`` is the recorded step's list and
        every row of ``micro`` was recorded; freely otherwise."""
        rows = [int(row) for row in micro.rows]
        if self.mode == "r3" and samples is not self._samples:
            self.recording_pass(samples)             # a step without an old-log-prob pass
        if samples is self._samples and not self._shared:
            self._share()
        if samples is not self._samples or not micro.counts or any(row not in self.per_sample for row in rows):
            self.free += 1
            yield
            return
        self.replayed += 1
        with replaying(self.model, pack_for(self.per_sample, micro.input_ids.cpu(), rows)):
            yield


    def _share(self) -> None:
        """Give every data-parallel rank the choices each recorded (R2: collective over ``dp_group``)."""
        import torch.distributed as dist

        gathered: list[dict[int, torch.Tensor] | None] = [None] * self.dp_size
        dist.all_gather_object(gathered, self.per_sample, group=self.dp_group)
        for part in gathered:
            self.per_sample.update(part or {})
        self._shared = True


def _routers(model: Any) -> list[Any]:
    from megatron.core.transformer.moe.router import TopKRouter

    return [module for module in model.modules() if isinstance(module, TopKRouter)]


__all__ = ["CONFIG_KWARGS", "StepRouting", "engine_routing", "pack_for", "recording", "replay_instances",
           "replaying", "split_by_sample"]
