"""One optimizer update from micro-batch losses: what a plain-PyTorch trainer's policy and critic
updates share (imports torch).

:func:`optimizer_update` zeroes the gradients, backpropagates each micro-batch's loss and sums its
metrics, sums gradients and metrics over the data-parallel ranks (:class:`GradientSync`), clips the
global gradient norm to ``--clip-grad``, then steps the optimizer and the learning-rate scheduler,
unless the summed loss or the gradient norm is not finite: then it refuses the update (gradients
cleared, optimizer and scheduler not stepped) and says why with a ``bad_step/<reason>`` metric
(:mod:`plasmid_torch.step_guard`), which refuses the whole train step. Both values are computed
from sums over the ranks, so every rank takes the same decision. A trainer whose framework owns
these steps (megatron's ``forward_backward_func`` and optimizer) keeps its own.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Any, Protocol

import torch

from plasmid_torch.step_guard import loss_and_grad_problem, refusal

#: the summed micro-batch losses, carried through :meth:`GradientSync.sum_metrics` with the metrics
#: (so the check needs no collective of its own), then taken out
_LOSS = "\0loss"

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
        ``<prefix>skipped_updates`` (0.0: kept for the metric's name; an update is no longer
        dropped alone). When the summed loss or the norm is not finite the update is refused:
        the metrics are then only the finite ones and ``bad_step/<prefix>nonfinite_loss`` or
        ``bad_step/<prefix>nonfinite_grad_norm`` = 1.0; the gradients are cleared and neither the
        optimizer nor the scheduler steps.
    """
    sync = OneProcess() if sync is None else sync
    trained = [parameter for parameter in parameters if parameter.requires_grad]
    optimizer.zero_grad(set_to_none=True)
    totals: dict[str, float] = defaultdict(float)
    loss_sum: torch.Tensor | None = None
    for loss, metrics in micro_losses:
        loss.backward()
        loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
        for name, metric in metrics.items():
            totals[name] += float(metric)
    totals[_LOSS] = 0.0 if loss_sum is None else float(loss_sum)
    sync.sum_gradients(trained)
    totals = sync.sum_metrics(totals)
    loss_total = totals.pop(_LOSS, 0.0)
    max_norm = clip_grad if clip_grad > 0 else math.inf
    norm = torch.nn.utils.clip_grad_norm_(trained, max_norm)
    # an FSDP2 model's norm is a DTensor of partial sums: full_tensor() reduces it over the ranks
    full_tensor = getattr(norm, "full_tensor", None)
    grad_norm = float(full_tensor() if callable(full_tensor) else norm)
    lr = optimizer.param_groups[0]["lr"]
    problem = loss_and_grad_problem(loss_total, grad_norm, prefix=prefix)
    if problem is not None:
        optimizer.zero_grad(set_to_none=True)
        reported = {**totals, f"{prefix}grad_norm": grad_norm, f"{prefix}lr": lr}
        return {**{name: value for name, value in reported.items() if math.isfinite(value)}, **refusal(problem)}
    optimizer.step()
    scheduler.step()
    return {**totals, f"{prefix}grad_norm": grad_norm, f"{prefix}lr": lr, f"{prefix}skipped_updates": 0.0}


__all__ = ["GradientSync", "OneProcess", "optimizer_update"]
