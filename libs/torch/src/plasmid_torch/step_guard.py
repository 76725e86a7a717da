"""Refusing a bad train step: the reasons, and the snapshot that puts a step's changes back (imports torch).

The kernel's contract (:meth:`plasmid.protocols.Trainer.train_step`): a step the trainer refuses
leaves the weights, the optimizer state, the learning-rate schedule and the step counters exactly
as they were, and reports each reason as the metric ``train/bad_step/<reason>`` = 1.0
(:data:`plasmid.protocols.BAD_STEP_PREFIX`). The reasons the shared recipe
(:class:`plasmid_torch.train_step.TrainStep`) and its optimizer updates give:

- ``nonfinite_loss`` / ``critic_nonfinite_loss``: an update's loss (summed over its micro-batches
  and ranks) is NaN or infinite; checked before the optimizer steps;
- ``nonfinite_grad_norm`` / ``critic_nonfinite_grad_norm``: its global gradient norm is (also
  megatron's fp16 loss-scale overflow, ``found_inf``); checked before the optimizer steps;
- ``nonfinite_weights``: after an update a trained weight is NaN or infinite;
- ``weights_blew_up``: after an update the weights moved, since the step began, by more than
  ``--max-update-ratio`` times their norm: ``||w - w_0|| / ||w_0|| > bound`` over the trained
  weights (``--lr 1e12`` makes AdamW move every weight by about 1e12, which stays finite).

Semantics with several optimizer updates per step (``--global-batch-size``): the **whole step** is
refused when any of its updates is; the updates already made are undone from the snapshot taken
when the step began (:class:`TorchSnapshot`), and the step's later updates are not made.

Cost: the snapshot copies the trained weights and the optimizer state (with AdamW about three
times the weights' bytes, in the memory the trainer keeps them in) once per step, and the weight
check reads the weights twice per update (their norm and their distance to the snapshot). It is
taken only when it can be needed: when the step makes more than one update, or when the weight
check is on (``--max-update-ratio`` > 0, the default). ``--max-update-ratio 0`` turns the weight
check off, and with one update per step no copy is made at all; the loss and gradient checks
cost nothing measurable either way (one scalar each, computed already).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import torch

from plasmid.protocols import BAD_STEP_PREFIX

#: The prefix of an update's refusal metric (an update's metric names have no ``train/``), so that
#: ``"train/" + BAD_UPDATE_PREFIX + reason`` is ``BAD_STEP_PREFIX + reason``.
BAD_UPDATE_PREFIX = BAD_STEP_PREFIX.removeprefix("train/")


def refusal(reason: str) -> dict[str, float]:
    """An update's metric saying it refused to step: ``{"bad_step/<reason>": 1.0}``."""
    return {BAD_UPDATE_PREFIX + reason: 1.0}


def refused(metrics: Mapping[str, float]) -> list[str]:
    """The refusal reasons among an update's metrics (``[]`` when it stepped)."""
    return [name.removeprefix(BAD_UPDATE_PREFIX) for name in metrics if name.startswith(BAD_UPDATE_PREFIX)]


def loss_and_grad_problem(loss: float, grad_norm: float, *, prefix: str = "") -> str | None:
    """The reason to refuse an update with this summed ``loss`` and global ``grad_norm`` (both the
    same on every rank: they are computed from summed values), or ``None``."""
    if not math.isfinite(loss):
        return f"{prefix}nonfinite_loss"
    if not math.isfinite(grad_norm):
        return f"{prefix}nonfinite_grad_norm"
    return None


class StepSnapshot(Protocol):
    """What a trainer's ``snapshot()`` part returns, taken before a step's first update."""

    def weights_problem(self, max_update_ratio: float) -> str | None:
        """``"nonfinite_weights"``, ``"weights_blew_up"`` (moved by more than ``max_update_ratio``
        times their norm since the snapshot; 0: not checked) or ``None``: the same answer on
        every rank of the trainer (collective there)."""
        ...

    def restore(self) -> None:
        """Put the weights, optimizer state and schedules back exactly as they were; gradients cleared."""
        ...


def no_agreement(flag: bool) -> bool:
    """The ``agree`` of a trainer of one process: its own answer."""
    return flag


class TorchSnapshot:
    """A copy of what an optimizer step changes, restored in place.

    :param weights: the trained tensors whose movement :meth:`weights_problem` measures (the
        model's parameters with ``requires_grad``; a rank's own shard where they are sharded).
    :param optimizers: ``torch.optim.Optimizer`` s (megatron: the torch optimizers inside its own);
        their per-parameter state (AdamW moments, step) and their param-group settings (``lr``, ...).
    :param schedulers: learning-rate schedulers (torch's or megatron's): their attributes except the
        optimizer they drive.
    :param tensors: other tensors to restore, not measured (megatron's fp32 main weights).
    :param agree: ``agree(flag) -> bool``: whether any rank's ``flag`` is true (an all-reduce over
        the trainer's ranks; :func:`no_agreement` for one process).
    """

    def __init__(self, weights: Iterable[torch.Tensor], *, optimizers: Sequence[torch.optim.Optimizer] = (),
                 schedulers: Sequence[Any] = (), tensors: Iterable[torch.Tensor] = (),
                 agree: Callable[[bool], bool] = no_agreement) -> None:
        self.weights = _distinct(weights)
        self.others = [tensor for tensor in _distinct(tensors) if not any(tensor is w for w in self.weights)]
        self.agree = agree
        with torch.no_grad():
            self.saved_weights = [weight.detach().clone() for weight in self.weights]
            self.saved_others = [tensor.detach().clone() for tensor in self.others]
            self.weight_norm = _norm(self.saved_weights)
        self.optimizers = list(optimizers)
        self.saved_states = [_optimizer_state(optimizer) for optimizer in self.optimizers]
        self.schedulers = list(schedulers)
        self.saved_schedulers = [_attributes(scheduler) for scheduler in self.schedulers]

    def weights_problem(self, max_update_ratio: float) -> str | None:
        if max_update_ratio <= 0:
            return None
        with torch.no_grad():     # the snapshot is finite, so the weights are iff their distance to it is
            now = [weight.detach() for weight in self.weights]
            moved = _norm(torch._foreach_sub(now, self.saved_weights)) if now else 0.0
        nonfinite = self.agree(not math.isfinite(moved))
        if nonfinite:
            return "nonfinite_weights"
        blew_up = self.agree(moved > max_update_ratio * self.weight_norm)
        return "weights_blew_up" if blew_up else None

    def restore(self) -> None:
        with torch.no_grad():
            for tensor, saved in zip([*self.weights, *self.others], [*self.saved_weights, *self.saved_others],
                                     strict=True):
                tensor.copy_(saved)
                tensor.grad = None
        for optimizer, state in zip(self.optimizers, self.saved_states, strict=True):
            _restore_optimizer_state(optimizer, state)
        for scheduler, attributes in zip(self.schedulers, self.saved_schedulers, strict=True):
            vars(scheduler).update(copy.deepcopy(attributes))


def _distinct(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    seen: set[int] = set()
    kept = []
    for tensor in tensors:
        if id(tensor) not in seen:
            seen.add(id(tensor))
            kept.append(tensor)
    return kept


def _norm(tensors: Sequence[torch.Tensor]) -> float:
    """The 2-norm of all ``tensors`` together (float64 over the per-tensor norms)."""
    if not tensors:
        return 0.0
    return float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(list(tensors))).to(torch.float64)))


_OptimizerState = tuple[list[tuple[torch.Tensor, dict[str, Any]]], list[dict[str, Any]]]


def _optimizer_state(optimizer: torch.optim.Optimizer) -> _OptimizerState:
    per_parameter = [(parameter, {name: value.detach().clone() if isinstance(value, torch.Tensor)
                                  else copy.deepcopy(value) for name, value in state.items()})
                     for parameter, state in optimizer.state.items()]
    groups = [{name: copy.deepcopy(value) for name, value in group.items() if name != "params"}
              for group in optimizer.param_groups]
    return per_parameter, groups


def _restore_optimizer_state(optimizer: torch.optim.Optimizer, saved: _OptimizerState) -> None:
    """In place: tensors kept by others (offloading) stay valid; state made since the snapshot
    (an optimizer's first step creates it) is dropped."""
    per_parameter, groups = saved
    kept = {id(parameter) for parameter, _ in per_parameter}
    for parameter in [p for p in optimizer.state if id(p) not in kept]:
        del optimizer.state[parameter]
    with torch.no_grad():
        for parameter, state in per_parameter:
            live = optimizer.state[parameter]
            for name in [name for name in live if name not in state]:
                del live[name]
            for name, value in state.items():
                current = live.get(name)
                if (isinstance(value, torch.Tensor) and isinstance(current, torch.Tensor)
                        and current.shape == value.shape and current.dtype == value.dtype):
                    current.copy_(value)
                else:
                    live[name] = value.clone() if isinstance(value, torch.Tensor) else copy.deepcopy(value)
    for group, settings in zip(optimizer.param_groups, groups, strict=True):
        group.update(copy.deepcopy(settings))


def _attributes(scheduler: Any) -> dict[str, Any]:
    return {name: copy.deepcopy(value) for name, value in vars(scheduler).items() if name != "optimizer"}


__all__ = ["BAD_UPDATE_PREFIX", "StepSnapshot", "TorchSnapshot", "loss_and_grad_problem", "no_agreement",
           "refusal", "refused"]
