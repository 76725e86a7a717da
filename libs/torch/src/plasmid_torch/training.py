"""What every trainer plugin checks and measures the same way (imports torch).

Not imported by ``import plasmid``; trainer plugins import it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import torch

from plasmid.kernel_options import RolloutOptions
from plasmid.types import Sample
from plasmid_torch.trainer_options import TrainerOptions


def check_samples(samples: Sequence[Sample]) -> None:
    """Raise ``ValueError`` naming the first sample a trainer cannot train on: no response
    tokens, no prompt token before the response, or a ``loss_mask`` / ``rollout_logprobs``
    whose length is not ``response_length``."""
    for position, sample in enumerate(samples):
        length, mask, logprobs = sample.response_length, sample.loss_mask, sample.rollout_logprobs
        if (length >= 1 and len(sample.tokens) > length and (mask is None or len(mask) == length)
                and (logprobs is None or len(logprobs) == length)):
            continue  # the usual case, checked without building a message
        where = f"sample {position} (index {sample.index}, group {sample.group_index})"
        if length < 1:
            raise ValueError(f"{where} has no response tokens (response_length={length}); drop it before training")
        if sample.prompt_length < 1:
            raise ValueError(f"{where} has no prompt token before its response (tokens={len(sample.tokens)}, "
                             f"response_length={length}): the first response token needs a prefix")
        if mask is not None and len(mask) != length:
            raise ValueError(f"{where}: loss_mask has {len(mask)} entries for {length} response tokens")
        raise ValueError(f"{where}: rollout_logprobs has {len(logprobs or [])} entries for {length} response tokens")


def check_trainer_setup(trainer: str, option: Any, loss: Any) -> None:
    """What every trainer checks first (``UsageError`` naming ``trainer``): ``--model`` is set, and
    a loss that ``needs_critic`` has ``value_loss`` to train the critic with."""
    from plasmid.errors import UsageError

    if not option.model:
        raise UsageError(f"{trainer}: --model is not set; give a local Hugging Face model directory")
    if getattr(loss, "needs_critic", False) and not callable(getattr(loss, "value_loss", None)):
        raise UsageError(f"{trainer}: the loss {type(loss).__name__} needs a critic (needs_critic) but has no "
                         f"value_loss(batch, values) to train it with (see plasmid.protocols.CriticLoss)")


def index_chunks(size: int, chunk_size: int | None) -> list[list[int]]:
    """Positions ``0 .. size - 1`` in consecutive runs of ``chunk_size`` (one run when it is unset):
    a step's samples per optimizer update (``--global-batch-size``), or per micro-batch."""
    chunk = max(1, chunk_size or size)
    return [list(range(start, min(size, start + chunk))) for start in range(0, size, chunk)]


def update_metrics(per_update: Sequence[dict[str, float]]) -> dict[str, float]:
    """A step's ``train/<name>`` metrics from its updates' metrics (one dict per update): the mean
    over the updates that report a name, except the learning rates (``lr``, ``critic_lr``: the last
    update's), skipped-update counts (``skipped_updates``, ``critic_skipped_updates``) and times
    (names ending in ``_seconds``, :func:`timed_update`'s): summed."""
    columns: dict[str, list[float]] = {}
    for update in per_update:
        for name, value in update.items():
            columns.setdefault(name, []).append(value)
    metrics = {f"train/{name}": sum(values) / len(values) for name, values in columns.items()}
    if per_update:
        for name in ("lr", "critic_lr"):
            if name in per_update[-1]:
                metrics[f"train/{name}"] = per_update[-1][name]
    for name in ("skipped_updates", "critic_skipped_updates", *(n for n in columns if n.endswith("_seconds"))):
        if name in columns:
            metrics[f"train/{name}"] = sum(columns[name])
    return metrics


MicroLosses = TypeVar("MicroLosses")


def timed_update(update: Callable[[Iterator[MicroLosses]], dict[str, float]], micro_losses: Iterable[MicroLosses],
                 device: torch.device, *, prefix: str = "") -> dict[str, float]:
    """``update(micro_losses)`` (an :func:`plasmid_torch.optimizer_update.optimizer_update` call
    that consumes the micro-batch losses in order), its metrics with ``<prefix>forward_backward_seconds``
    (from the call to the moment the last micro-batch's backward pass returned control: zeroing the
    gradients, every forward and backward pass) and ``<prefix>optimizer_seconds`` (the rest: gradient
    all-reduce, clipping, the optimizer and scheduler steps) added. The device is synchronised at
    both marks (CUDA runs asynchronously), so this costs a little: ``--profile`` turns it on."""
    marks: list[float] = []

    def watched() -> Iterator[MicroLosses]:
        yield from micro_losses
        synchronize(device)
        marks.append(time.perf_counter())

    began = time.perf_counter()
    metrics = update(watched())
    synchronize(device)
    ended = time.perf_counter()
    turned = marks[0] if marks else ended
    return {**metrics, f"{prefix}forward_backward_seconds": turned - began,
            f"{prefix}optimizer_seconds": ended - turned}


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (CUDA); nothing on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def updates_per_rollout(trainer: TrainerOptions, rollout: RolloutOptions) -> int:
    """Optimizer updates per RL step: one per ``--global-batch-size`` samples of the step's
    ``--prompts-per-step`` x ``--n-samples-per-prompt`` (one when the global batch size is unset),
    in each of its ``--num-iterations`` passes."""
    if trainer.global_batch_size is None:
        return trainer.num_iterations
    return max(1, math.ceil(rollout.samples_per_step / trainer.global_batch_size)) * trainer.num_iterations


def scheduled_updates(trainer: TrainerOptions, rollout: RolloutOptions) -> int:
    """Optimizer updates of the whole run, the length of the learning-rate schedule:
    ``--num-rollouts`` x :func:`updates_per_rollout`."""
    return rollout.num_rollouts * updates_per_rollout(trainer, rollout)


def pad_rows(rows: Sequence[Sequence[float]], width: int, *, fill: float = 0,
             dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``[len(rows), width]`` tensor of ``rows``, each right-padded with ``fill`` to ``width``
    (per-token lists of a batch: ids, masks, log-probs). Built in one tensor construction, not one
    per row: trainers call it on every step's whole batch."""
    if not rows:
        return torch.empty((0, width), dtype=dtype)
    return torch.tensor([list(row) + [fill] * (width - len(row)) for row in rows], dtype=dtype)


def response_mask(samples: Sequence[Sample], width: int) -> torch.Tensor:
    """``[B, width]`` float32: each sample's ``loss_mask`` (ones when unset), 0 beyond its response."""
    return pad_rows([s.loss_mask if s.loss_mask is not None else [1] * s.response_length for s in samples], width)


def rollout_logprob_abs_diff(samples: Sequence[Sample], trainer_logprobs: torch.Tensor,
                             mask: torch.Tensor, rollout: torch.Tensor | None = None) -> float | None:
    """``train_rollout_logprob_abs_diff``: the mean over trained tokens of
    ``|trainer log-prob - engine log-prob|`` (``trainer_logprobs`` and ``mask`` are ``[B, T]``
    aligned with ``samples``' responses). Samples without rollout log-probs are skipped;
    ``None`` when none has them. After a correct weight sync this is float rounding (<= 1e-4).
    ``rollout``: every sample's rollout log-probs already padded to ``[B, T]`` (the step's
    :class:`plasmid.types.LossBatch` has them), used instead of padding them again."""
    width = mask.shape[1]
    if rollout is not None:
        engine, counted = rollout.float(), mask.float()
    else:
        has = torch.tensor([s.rollout_logprobs is not None for s in samples], dtype=torch.float32)
        engine = pad_rows([s.rollout_logprobs or () for s in samples], width)
        counted = mask.float() * has.unsqueeze(1)
    count = float(counted.sum())
    if not count:
        return None
    return float(((trainer_logprobs.float() - engine).abs() * counted).sum()) / count


def batch_metrics(samples: Sequence[Sample], advantages: torch.Tensor, mask: torch.Tensor,
                  trainer_logprobs: torch.Tensor | None, rollout: torch.Tensor | None = None) -> dict[str, float]:
    """The per-step metrics every trainer reports about the batch it trained on: advantage
    mean/std over trained tokens, ``train_rollout_logprob_abs_diff`` (when both log-probs exist),
    samples and trained tokens; ``advantages``, ``mask``, ``trainer_logprobs`` are ``[B, T]``;
    ``rollout``: see :func:`rollout_logprob_abs_diff`."""
    trained = advantages[mask > 0]
    metrics = {
        "train/advantage_mean": float(trained.mean()) if trained.numel() else 0.0,
        "train/advantage_std": float(trained.std(unbiased=False)) if trained.numel() else 0.0,
        "train/samples": float(len(samples)),
        "train/tokens": float(mask.sum()),
    }
    if trainer_logprobs is not None:
        diff = rollout_logprob_abs_diff(samples, trainer_logprobs, mask, rollout)
        if diff is not None:
            metrics["train/train_rollout_logprob_abs_diff"] = diff
    return metrics


def critic_batch_metrics(batch: Any) -> dict[str, float]:
    """A critic's values before the update against the step's returns, over the trained tokens of
    a :class:`plasmid.types.LossBatch` with ``values`` (and ``returns``) filled in:
    ``train/value_mean``, ``train/returns_mean``, ``train/explained_variance``. Trainers with a
    critic call it once per step on the whole batch."""
    from plasmid_torch import algorithms

    trained = batch.response_mask > 0
    values = batch.values[trained]
    metrics = {"train/value_mean": float(values.mean()) if values.numel() else 0.0}
    if batch.returns is not None:
        returns = batch.returns[trained]
        metrics["train/returns_mean"] = float(returns.mean()) if returns.numel() else 0.0
        metrics["train/explained_variance"] = algorithms.explained_variance(batch.values, batch.returns,
                                                                            batch.response_mask)
    return metrics
