"""One optimizer update from micro-batch losses: what a plain-PyTorch trainer's policy and critic
updates share (imports torch).

:func:`optimizer_update` zeroes the gradients, backpropagates each micro-batch's loss and sums its
metrics, sums gradients and metrics over the data-parallel ranks (:class:`GradientSync`), clips the
global gradient norm to ``--clip-grad``, drops an update whose norm is not finite (it would poison
the weights), steps the optimizer and then the learning-rate scheduler. A trainer whose framework
owns these steps (megatron's ``forward_backward_func`` and optimizer) keeps its own.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Any, Protocol

import torch


class GradientSync(Protocol):
    """How a trainer's data-parallel ranks combine what each computed on its shard of an update.

    Every rank normalises its micro-batch losses by the update's *global* totals, so gradients and
    loss metrics are summed (not averaged): then every rank clips, steps and reports exactly what
    one process training the whole update would. ``plasmid_torchtrain.distributed.DataParallel``
    is one; :class:`OneProcess` is the single-rank no-op.
    """

    def sum_gradients(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """Replace each parameter's ``.grad`` by its sum over the ranks (a missing one counts 0)."""
        ...

    def sum_metrics(self, totals: dict[str, float]) -> dict[str, float]:
        """``totals`` summed over the ranks, name by name (a name missing on a rank counts 0)."""
        ...


class OneProcess:
    """The :class:`GradientSync` of a trainer of one rank: nothing to combine."""

    def sum_gradients(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        return None

    def sum_metrics(self, totals: dict[str, float]) -> dict[str, float]:
        return dict(totals)


def optimizer_update(optimizer: torch.optim.Optimizer, scheduler: Any, parameters: Iterable[torch.nn.Parameter],
                     micro_losses: Iterable[tuple[torch.Tensor, dict[str, float]]], *, clip_grad: float,
                     sync: GradientSync | None = None, prefix: str = "") -> dict[str, float]:
    """One update of ``optimizer`` over ``parameters`` (those with ``requires_grad``).

    :param micro_losses: ``(loss, metrics)`` of each of this rank's micro-batches, in order; an
        iterator is consumed lazily, so each micro-batch's forward pass runs after the previous
        one's backward (one micro-batch of activations alive at a time). Each ``loss`` is a scalar
        normalised by the update's totals, so the summed gradient is the whole update's.
    :param clip_grad: max global gradient norm (``--clip-grad``); 0 turns clipping off.
    :param sync: sums gradients and metrics over data-parallel ranks (default: one process).
    :param prefix: put before the update's own metric names (``"critic_"`` for a critic).
    :returns: the micro-batch metrics summed (over micro-batches and ranks), then
        ``<prefix>grad_norm`` (before clipping), ``<prefix>lr`` (the rate this update used) and
        ``<prefix>skipped_updates`` (1.0 when the norm was not finite and the update was dropped).
        The scheduler steps either way.
    """
    sync = OneProcess() if sync is None else sync
    trained = [parameter for parameter in parameters if parameter.requires_grad]
    optimizer.zero_grad(set_to_none=True)
    totals: dict[str, float] = defaultdict(float)
    for loss, metrics in micro_losses:
        loss.backward()
        for name, metric in metrics.items():
            totals[name] += float(metric)
    sync.sum_gradients(trained)
    totals = sync.sum_metrics(totals)
    max_norm = clip_grad if clip_grad > 0 else math.inf
    grad_norm = float(torch.nn.utils.clip_grad_norm_(trained, max_norm))
    lr = optimizer.param_groups[0]["lr"]
    skipped = not math.isfinite(grad_norm)
    if skipped:
        optimizer.zero_grad(set_to_none=True)
    else:
        optimizer.step()
    scheduler.step()
    return {**totals, f"{prefix}grad_norm": grad_norm, f"{prefix}lr": lr, f"{prefix}skipped_updates": float(skipped)}


__all__ = ["GradientSync", "OneProcess", "optimizer_update"]
