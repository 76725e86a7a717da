"""The megatron trainer's optimizer step refuses a bad update before anything moves: a non-finite
loss, megatron's ``found_inf`` (fp16 loss scaling) and a non-finite gradient norm each clear the
gradients, leave the optimizer and the LR schedule unstepped and report
``bad_step/<reason>``. (The whole-trainer behaviour is the trainer contract's, in
test_megatron_contract.py.)"""

from __future__ import annotations

import math

import pytest
from plasmid_megatron.trainer import MegatronTrainer


class StandInOptimizer:
    """Megatron's optimizer interface as ``_optimizer_step`` uses it, recording the calls."""

    def __init__(self, *, found_inf: bool = False, grad_norm: float = 1.0) -> None:
        self.found_inf, self.grad_norm = found_inf, grad_norm
        self.calls: list[str] = []
        self.param_groups = [{"lr": 0.5}]
        self.chained_optimizers: list = []

    def prepare_grads(self) -> bool:
        self.calls.append("prepare_grads")
        return self.found_inf

    def get_grad_norm(self) -> float:
        self.calls.append("get_grad_norm")
        return self.grad_norm

    def zero_grad(self) -> None:
        self.calls.append("zero_grad")

    def step_with_ready_grads(self) -> bool:
        self.calls.append("step")
        return True


class StandInScheduler:
    def __init__(self) -> None:
        self.steps = 0

    def step(self, increment: int) -> None:
        self.steps += increment


@pytest.mark.parametrize(("loss", "optimizer", "reason"), [
    (math.nan, StandInOptimizer(), "nonfinite_loss"),
    (math.inf, StandInOptimizer(), "nonfinite_loss"),
    (1.0, StandInOptimizer(found_inf=True), "nonfinite_grad_norm"),
    (1.0, StandInOptimizer(grad_norm=math.nan), "nonfinite_grad_norm"),
    (1.0, StandInOptimizer(grad_norm=math.inf), "nonfinite_grad_norm"),
])
@pytest.mark.parametrize("prefix", ["", "critic_"])
def test_a_bad_update_is_refused_before_the_optimizer_or_the_schedule_moves(loss, optimizer, reason, prefix):
    optimizer.calls.clear()
    scheduler = StandInScheduler()
    trainer = MegatronTrainer.__new__(MegatronTrainer)
    metrics = trainer._optimizer_step(loss, optimizer, scheduler, prefix=prefix)
    assert metrics == {f"bad_step/{prefix}{reason}": 1.0}
    assert "step" not in optimizer.calls and optimizer.calls[-1] == "zero_grad"
    assert scheduler.steps == 0, "a refused update must not advance the LR schedule"


def test_a_good_update_steps_the_schedule_then_the_optimizer():
    optimizer, scheduler = StandInOptimizer(grad_norm=2.0), StandInScheduler()
    trainer = MegatronTrainer.__new__(MegatronTrainer)
    metrics = trainer._optimizer_step(1.0, optimizer, scheduler, prefix="critic_")
    assert metrics == {"critic_grad_norm": 2.0, "critic_lr": 0.5, "critic_skipped_updates": 0.0}
    assert optimizer.calls == ["prepare_grads", "get_grad_norm", "step"] and scheduler.steps == 1


def test_an_fp16_overflow_under_a_dynamic_loss_scale_is_a_skipped_update_not_a_bad_step():
    """The scaler backing off is routine in fp16; it must not count towards --max-bad-steps."""
    from megatron.core.optimizer.grad_scaler import DynamicGradScaler

    optimizer, scheduler = StandInOptimizer(found_inf=True), StandInScheduler()
    optimizer.grad_scaler = DynamicGradScaler(initial_scale=2.0**16, min_scale=1.0, growth_factor=2.0,
                                              backoff_factor=0.5, growth_interval=1000, hysteresis=2)
    trainer = MegatronTrainer.__new__(MegatronTrainer)
    metrics = trainer._optimizer_step(1.0, optimizer, scheduler)
    assert metrics == {"lr": 0.5, "skipped_updates": 1.0}
    assert "step" not in optimizer.calls and optimizer.calls[-1] == "zero_grad" and scheduler.steps == 0
