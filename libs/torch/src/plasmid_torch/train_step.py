"""The RL train step, written once: every trainer supplies its parts, :class:`TrainStep` does the rest
(imports torch).

The shape is torchtitan's ``TrainSpec``: a trainer is a small record of what differs (here
:class:`TrainerParts`: how its models compute log-probs and values, how it makes one optimizer
update) around one shared recipe. One call of :meth:`TrainStep.run` on a
:class:`plasmid.types.RolloutBatch` of ``B`` samples, ``T`` the longest response:

1. an empty batch reports ``train/samples``, ``train/tokens``, ``train/updates`` (all 0) and
   ``train/seconds``, and counts no step;
2. a loss with a ``training_samples(samples, rollout_id)`` method (plasmid-sft's) replaces the
   samples by what it returns (the tokens it trains on; ``rollout_id`` is the batch's, so a loss
   that varies by step decides the same way in a resumed run); the samples are checked
   (:func:`plasmid_torch.training.check_samples`; every reward finite);
3. ``inputs = parts.prepare(samples)``: the samples in the trainer's own form (padded tensors, ...),
   handed to every other part;
4. the :class:`plasmid.types.LossBatch` of the whole batch, on ``parts.device``: rewards, groups,
   ``response_mask`` (each sample's ``loss_mask``), the rollout's log-probs when every sample has
   them; ``old_logprobs``: the policy's, computed now, when the loss ``needs_old_logprobs`` or a
   sample has no rollout log-probs, else the rollout's (on an exactly on-policy step they are
   taken from the update's own forward passes instead: :meth:`TrainStep.reuses_update_forward`);
   ``ref_logprobs`` when there is a reference model, else, when the loss has a
   ``reference_logprobs_key`` (plasmid-opd's teacher), each sample's ``metadata[key]``
   (:func:`sample_logprobs`); ``values`` (the critic's, before any update) when there is a critic;
5. ``loss.advantages`` on the whole batch fills ``advantages`` and ``returns``;
6. the warm-up rule: the policy is trained unless there is a critic and fewer than
   ``--critic-warmup-steps`` steps were trained (a loss without a critic ignores the option);
7. one optimizer update per ``--global-batch-size`` samples (one for the whole batch when unset):
   ``parts.policy_update`` (when the policy is trained), then ``parts.critic.update``, each
   given the batch with ``total_tokens`` / ``total_samples`` of that chunk; with
   ``--num-iterations N`` the chunks' updates are made ``N`` times (passes), each pass over the
   same chunks in the same order (not shuffled), all against the LossBatch of steps 4-5: its old
   log-probs, advantages, returns and values are taken once, before the first pass, so from the
   second pass the policy's ratio to the old log-probs moves away from 1 and the loss's clip acts
   as in PPO's epochs;
8. metrics: the updates' (:func:`plasmid_torch.training.update_metrics`), with a critic
   :func:`~plasmid_torch.training.critic_batch_metrics` and ``train/policy_updated``, the batch's
   (:func:`~plasmid_torch.training.batch_metrics`), the train/rollout mismatch
   (:meth:`TrainStep.mismatch_metrics`: ``train/mismatch_kl``, ``train/logprob_abs_diff_mean``,
   ``train/token_prob_ratio_max``, ... and the first update's ``train/ppo_kl``), ``train/updates``
   (policy updates made, of every pass) and ``train/seconds``; with ``--num-iterations`` > 1 the
   clip fractions (metrics named ``*clip_frac``) are the mean over the last pass's updates only
   (the first pass's ratio is 1 on-policy, so the mean over every pass would dilute them); the
   step and policy-update counters (:attr:`TrainStep.steps`, :attr:`TrainStep.updates`) advance,
   and a checkpoint saves them.

A bad step is refused whole (:mod:`plasmid_torch.step_guard`): before the first update the recipe
takes ``parts.snapshot()`` when the step makes more than one optimizer update (over all its
passes) or the weight check is on (``--max-update-ratio`` > 0), and the weight check compares
with that copy after every update of every pass; an update that refuses (a non-finite loss or gradient norm, its
``bad_step/<reason>`` metric) or weights that are then non-finite or moved too far stop the step:
the snapshot is restored (weights, optimizer state, schedules), no later update is made, the
counters stay, and the metrics are ``train/bad_step/<reason>`` = 1.0 with ``train/samples``,
``train/tokens``, ``train/updates`` (0), ``train/seconds`` and the finite metrics of the updates
made. Every rank takes the same decision (the checks agree over the ranks).

In a trainer of several ranks every rank runs the recipe on the same batch; the parts are
collective where the trainer needs them to be (each no-grad pass returns every row on every rank).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from plasmid.protocols import (
    BAD_STEP_PREFIX,
    Loss,
    SupportsOldLogprobsDeclaration,
    SupportsReferenceScores,
    SupportsTrainingSamples,
)
from plasmid.types import LossBatch, RolloutBatch, Sample
from plasmid_torch import turns
from plasmid_torch.mismatch import step_mismatch_metrics
from plasmid_torch.step_guard import StepSnapshot, refused
from plasmid_torch.trainer_options import TrainerOptions
from plasmid_torch.training import (
    batch_metrics,
    check_samples,
    critic_batch_metrics,
    index_chunks,
    pad_rows,
    response_mask,
    update_metrics,
)

#: ``update(batch, inputs, chunk) -> metrics``: one optimizer update over the samples ``chunk``
#: (positions in the step's batch). ``batch`` is the whole step's LossBatch with ``total_tokens``
#: and ``total_samples`` of the chunk (the normalisers of its micro-batch losses); select its rows
#: with ``batch.select(...)``. Metrics are names without the ``train/`` prefix.
Update = Callable[[LossBatch, Any, list[int]], dict[str, float]]


@dataclass(frozen=True)
class CriticParts:
    """What a trainer with a critic (for a loss that ``needs_critic``) supplies.

    :ivar values: ``values(inputs)``: ``[B, T]`` float32 CPU values of the state before each
        response token, no gradient, 0 beyond each response.
    :ivar update: one critic optimizer update (:data:`Update`) on ``loss.value_loss``; its
        metrics are the loss's and ``critic_grad_norm``, ``critic_lr``, ``critic_skipped_updates``.
    """

    values: Callable[[Any], torch.Tensor]
    update: Update


@dataclass(frozen=True)
class TrainerParts:
    """What a trainer supplies to :class:`TrainStep`: its loss, models, device and passes.

    :ivar loss: the run's :class:`plasmid.protocols.Loss`.
    :ivar policy: the policy model, handed back to :attr:`logprobs`.
    :ivar reference: the frozen reference model (the loss ``needs_ref``), else ``None``.
    :ivar logprobs: ``logprobs(model, inputs, temperature)``: ``[B, T]`` float32 CPU log-probs of
        every sample's response tokens under ``model``, no gradient, 0 beyond each response.
    :ivar policy_update: one policy optimizer update (:data:`Update`) on ``loss.policy_loss``; its
        metrics are ``loss``, the loss's own, ``grad_norm``, ``lr`` and ``skipped_updates``.
    :ivar critic: the critic's parts, ``None`` without a critic.
    :ivar device: where the step's LossBatch lives (where the trainer computes its losses).
    :ivar prepare: ``prepare(samples)``: the step's samples in the form the other parts take
        (default: the samples themselves).
    :ivar snapshot: ``snapshot()``: a :class:`plasmid_torch.step_guard.StepSnapshot` of everything
        the step's updates change (policy and critic weights, optimizer states, LR schedules). A
        trainer without one (``None``) gets no weight check, and a refusal after an update that
        stepped cannot undo that update.
    :ivar fills_old_logprobs: whether ``policy_update`` accepts ``old_logprobs_out=`` (a ``[B, T]``
        CPU float32 tensor of the whole step's rows): then, given it, every micro-batch whose
        ``old_logprobs`` the batch leaves ``None`` takes its forward pass's log-probs, detached,
        as its old log-probs (before ``loss.policy_loss``) and writes them into the rows
        ``chunk[micro]`` of that tensor. Only a trainer whose gradient forward pass computes the
        no-grad pass's numbers, bit for bit, on the same micro-batches may say so (one rank, no
        dropout); :meth:`TrainStep.reuses_update_forward` says when the recipe asks for it.
    """

    loss: Loss
    policy: Any
    reference: Any
    logprobs: Callable[[Any, Any, float], torch.Tensor]
    policy_update: Update
    critic: CriticParts | None = None
    device: torch.device = torch.device("cpu")
    prepare: Callable[[Sequence[Sample]], Any] = list
    snapshot: Callable[[], StepSnapshot] | None = None
    fills_old_logprobs: bool = False


class TrainStep:
    """The train-step recipe of every trainer (see the module docstring), with its counters.

    :param parts: what the trainer supplies.
    :param options: the run's trainer options (``--global-batch-size``, ``--critic-warmup-steps``).
    :param temperature: the sampling temperature (``--temperature``): old and reference log-probs
        are taken at it, as the engine reports them.
    """

    def __init__(self, parts: TrainerParts, options: TrainerOptions, *, temperature: float) -> None:
        self.parts = parts
        self.options = options
        self.temperature = temperature
        #: train steps completed (RL steps trained on; empty batches are not counted).
        self.steps = 0
        #: optimizer updates of the policy made (skipped ones included).
        self.updates = 0

    @property
    def trains_policy(self) -> bool:
        """Whether the next step updates the policy: unless there is a critic and fewer than
        ``--critic-warmup-steps`` steps were trained."""
        return self.parts.critic is None or self.steps >= self.options.critic_warmup_steps

    def run(self, batch: RolloutBatch) -> dict[str, float]:
        """One RL step on ``batch``; its ``train/...`` float metrics."""
        started = time.perf_counter()
        samples = batch.samples
        if not samples:
            return {"train/samples": 0.0, "train/tokens": 0.0, "train/updates": 0.0,
                    "train/seconds": time.perf_counter() - started}
        parts = self.parts
        if isinstance(parts.loss, SupportsTrainingSamples):
            samples = parts.loss.training_samples(samples, rollout_id=batch.rollout_id)
        check_samples(samples)
        check_rewards(samples)
        inputs = parts.prepare(samples)
        chunks = index_chunks(len(samples), self.options.global_batch_size)
        passes = self.options.num_iterations
        from_update = self.reuses_update_forward(len(chunks) * passes)
        loss_batch, trainer_old = self.loss_batch(samples, inputs, defer_old=from_update)
        loss_batch.advantages, loss_batch.returns = parts.loss.advantages(loss_batch)

        train_policy = self.trains_policy
        max_ratio = self.options.max_update_ratio
        optimizer_updates = len(chunks) * passes * (int(train_policy) + int(parts.critic is not None))
        snapshot = None
        if parts.snapshot is not None and (optimizer_updates > 1 or max_ratio > 0):
            snapshot = parts.snapshot()
        updates_before = self.updates
        per_update: list[dict[str, float]] = []
        reasons: list[str] = []
        for chunk in chunks * passes:
            chunk_batch = replace(loss_batch, total_tokens=int(loss_batch.response_mask[chunk].sum()),
                                  total_samples=len(chunk))
            update: dict[str, float] = {}
            if train_policy:
                fill = {"old_logprobs_out": trainer_old} if from_update and trainer_old is not None else {}
                update.update(parts.policy_update(chunk_batch, inputs, chunk, **fill))
                self.updates += 1
                reasons = refused(update)
            if not reasons and parts.critic is not None:
                update.update(parts.critic.update(chunk_batch, inputs, chunk))
                reasons = refused(update)
            if not reasons and snapshot is not None:
                problem = snapshot.weights_problem(max_ratio)
                reasons = [problem] if problem is not None else []
            per_update.append(update)
            if reasons:
                break
        if reasons:
            if snapshot is not None:
                snapshot.restore()
            self.updates = updates_before
            return self._refused(reasons, per_update, samples, loss_batch, started)
        self.steps += 1

        metrics = update_metrics(per_update)
        if passes > 1:
            last_pass = update_metrics(per_update[-len(chunks):])
            metrics.update({name: value for name, value in last_pass.items() if name.endswith("clip_frac")})
        if parts.critic is not None:
            metrics.update(critic_batch_metrics(loss_batch))
            metrics["train/policy_updated"] = float(train_policy)
        rollout = loss_batch.rollout_logprobs
        metrics.update(batch_metrics(samples, loss_batch.advantages.cpu(), loss_batch.response_mask.cpu(),
                                     trainer_old, None if rollout is None else rollout.cpu()))
        metrics.update(self.mismatch_metrics(loss_batch, trainer_old, per_update if train_policy else []))
        metrics["train/updates"] = float(len(per_update) if train_policy else 0)
        metrics["train/seconds"] = time.perf_counter() - started
        return metrics

    def _refused(self, reasons: list[str], per_update: list[dict[str, float]], samples: Sequence[Sample],
                 loss_batch: LossBatch, started: float) -> dict[str, float]:
        """The metrics of a refused step (see the module docstring)."""
        metrics = {name: value for name, value in update_metrics(per_update).items()
                   if math.isfinite(value) and not name.startswith(BAD_STEP_PREFIX)}
        metrics.update({BAD_STEP_PREFIX + reason: 1.0 for reason in reasons})
        if self.parts.critic is not None:
            metrics["train/policy_updated"] = 0.0
        metrics.update({"train/samples": float(len(samples)), "train/tokens": float(loss_batch.response_mask.sum()),
                        "train/updates": 0.0, "train/seconds": time.perf_counter() - started})
        return metrics

    def reuses_update_forward(self, updates: int) -> bool:
        """Whether this step's old log-probs are taken from its policy update's forward passes
        (``parts.policy_update(..., old_logprobs_out=...)``) instead of a no-grad pass of their own.

        That is the same policy on the same micro-batches, so the numbers are the same (the
        trainer says it computes them bit for bit: :attr:`TrainerParts.fills_old_logprobs`); what
        it saves is one forward pass over the batch. It is done only when nothing needs them
        before the update: the step makes ``updates == 1`` optimizer update (``--global-batch-size``
        unset or the whole batch, and ``--num-iterations 1``; with more, later updates, and every
        pass after the first, start from moved weights and need the old log-probs as they were), there is
        no critic (whose warm-up and advantages come first), and the loss says its
        ``advantages()`` does not read ``old_logprobs`` (``advantages_read_old_logprobs`` false;
        a loss without the attribute is taken to read them). The ratio of the policy loss is then
        exactly 1 and its gradient the plain policy gradient, as with a separate pass.
        """
        parts = self.parts
        return (parts.fills_old_logprobs and updates == 1 and parts.critic is None
                and isinstance(parts.loss, SupportsOldLogprobsDeclaration)
                and not parts.loss.advantages_read_old_logprobs)

    def loss_batch(self, samples: Sequence[Sample], inputs: Any, *,
                   defer_old: bool = False) -> tuple[LossBatch, torch.Tensor | None]:
        """The step's :class:`LossBatch` on ``parts.device`` (advantages not yet filled in), and the
        policy's old log-probs (``[B, T]`` CPU; ``None`` when the rollout's were used instead).

        With ``defer_old`` (:meth:`reuses_update_forward`), when the policy's old log-probs are
        needed they are not computed: the returned tensor is zeros for the policy update to fill
        in, and the batch's ``old_logprobs`` is ``None`` until then. A loss whose
        ``reads_turn_rewards`` is true gets a :class:`plasmid_torch.turns.TurnLossBatch` (the
        samples' per-turn rewards)."""
        parts = self.parts
        width = max(sample.response_length for sample in samples)
        mask = response_mask(samples, width)
        rollout_rows = [sample.rollout_logprobs for sample in samples if sample.rollout_logprobs is not None]
        rollout = pad_rows(rollout_rows, width) if len(rollout_rows) == len(samples) else None
        trainer_old = None
        deferred = False
        if (parts.loss.needs_old_logprobs or rollout is None) and defer_old:
            trainer_old, deferred = torch.zeros((len(samples), width)), True
        elif parts.loss.needs_old_logprobs or rollout is None:
            trainer_old = parts.logprobs(parts.policy, inputs, self.temperature)
        ref = None
        if parts.reference is not None:
            ref = parts.logprobs(parts.reference, inputs, self.temperature)
        elif isinstance(parts.loss, SupportsReferenceScores) and (key := parts.loss.reference_logprobs_key):
            ref = pad_rows(sample_logprobs(samples, str(key)), width)
        values = parts.critic.values(inputs) if parts.critic is not None else None
        on = functools.partial(_to, device=parts.device)
        batch = LossBatch(
            rewards=on(torch.tensor([sample.reward for sample in samples], dtype=torch.float32)),
            group_index=on(torch.tensor([sample.group_index for sample in samples], dtype=torch.long)),
            response_mask=on(mask),
            old_logprobs=None if deferred else on(trainer_old if trainer_old is not None else rollout),
            ref_logprobs=on(ref),
            rollout_logprobs=on(rollout),
            values=on(values),
            total_tokens=int(mask.sum()),
            total_samples=len(samples),
        )
        if getattr(parts.loss, "reads_turn_rewards", False):
            batch = turns.with_turns(batch, samples, width)
        return batch, trainer_old

    @staticmethod
    def mismatch_metrics(loss_batch: LossBatch, trainer_old: torch.Tensor | None,
                         per_update: Sequence[dict[str, float]]) -> dict[str, float]:
        """The step's train/rollout mismatch metrics (:mod:`plasmid_torch.mismatch`), whatever the
        loss: when the trainer computed old log-probs and the engine reported its own, those of
        :func:`~plasmid_torch.mismatch.step_mismatch_metrics` on the whole batch; and
        ``train/ppo_kl`` of the step's first policy update when the loss reports ``ppo_kl``
        (:func:`~plasmid_torch.mismatch.policy_kl`: its forward passes all precede its optimizer
        step, so it is the first micro-batch's figure, 0 on-policy)."""
        metrics: dict[str, float] = {}
        if trainer_old is not None and loss_batch.rollout_logprobs is not None:
            found = step_mismatch_metrics(trainer_old, loss_batch.rollout_logprobs.cpu(),
                                          loss_batch.response_mask.cpu())
            metrics.update({f"train/{name}": value for name, value in found.items()})
        if per_update and "ppo_kl" in per_update[0]:
            metrics["train/ppo_kl"] = per_update[0]["ppo_kl"]
        return metrics

    def counters(self) -> dict[str, int]:
        """``{"steps", "updates"}``, for a checkpoint."""
        return {"steps": self.steps, "updates": self.updates}

    def restore(self, counters: dict[str, Any]) -> None:
        """Continue counting from a checkpoint's :meth:`counters`."""
        self.steps = int(counters["steps"])
        self.updates = int(counters["updates"])


class StepCounters:
    """What a trainer built on a :class:`TrainStep` (its ``recipe``) reports of its progress."""

    recipe: TrainStep

    @property
    def steps(self) -> int:
        """Train steps completed (RL steps trained on)."""
        return self.recipe.steps

    @property
    def updates(self) -> int:
        """Optimizer updates of the policy made (skipped ones included)."""
        return self.recipe.updates


def check_rewards(samples: Sequence[Sample]) -> None:
    """Raise ``ValueError`` naming the first sample whose reward is missing or not finite."""
    for position, sample in enumerate(samples):
        if sample.reward is None or not math.isfinite(sample.reward):
            raise ValueError(f"sample {position} (index {sample.index}, group {sample.group_index}) has reward "
                             f"{sample.reward!r}: every sample must be scored with a finite reward before training")


def sample_logprobs(samples: Sequence[Sample], key: str) -> list[list[float]]:
    """Every sample's ``metadata[key]``, per-token log-probs of its response tokens (a loss's
    ``reference_logprobs_key``); ``ValueError`` naming the first sample without them or whose
    count is not its ``response_length``."""
    rows = []
    for position, sample in enumerate(samples):
        values = sample.metadata.get(key)
        if values is None or len(values) != sample.response_length:
            found = "none" if values is None else f"{len(values)} entries"
            raise ValueError(f"sample {position} (index {sample.index}, group {sample.group_index}): the loss reads "
                             f"reference log-probs from metadata[{key!r}] but it has {found} for "
                             f"{sample.response_length} response tokens (the generate function must attach them)")
        rows.append([float(value) for value in values])
    return rows


def _to(tensor: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    return None if tensor is None else tensor.to(device)


__all__ = ["CriticParts", "TrainStep", "TrainerParts", "Update", "check_rewards", "sample_logprobs"]
