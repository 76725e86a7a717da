"""The contract every loss (RL algorithm) provider satisfies (imports torch).

Subclass it in the plugin's tests, naming the plugin module and the provider::

    class TestGrpo(LossContract):
        plugin = plasmid_grpo.plugin
        provider = "grpo"
        config_options = {"kl_loss_coef": 0.1}   # optional: options to build the loss with

It builds the loss from the kernel and ``plugin`` alone: a loss needs no other plugin. What it
checks, on a small random batch with masked holes (padding and tool tokens):

- the flags ``needs_ref``, ``needs_critic``, ``needs_old_logprobs`` are booleans;
- every class in the provider's ``option_classes`` (the options it reads) is declared by the
  kernel or by ``plugin`` (``parser.add_options`` in its ``plasmid_addoption``);
- advantages are ``[B, T]``, finite, and zero where ``response_mask`` is 0;
- ``policy_loss`` is a finite scalar with finite gradients w.r.t. ``logprobs``;
- log-probs at masked positions change neither the loss nor any gradient;
- the losses (and metrics) of two micro-batches (``LossBatch.select``) sum to the full batch's,
  and so do their gradients: the trainer accumulates micro-batches and sums their metrics;
- at the first update (``logprobs == old_logprobs``) the gradient step raises the log-probs of
  tokens with positive advantage and lowers those with negative advantage, on balance.

When the loss ``needs_critic`` (the other checks are skipped otherwise):

- it is a :class:`~plasmid.protocols.CriticLoss`; ``returns`` are ``[B, T]``, finite, 0 where masked;
- ``value_loss`` is a finite scalar with finite gradients w.r.t. the values, which masked
  values change neither; micro-batch value losses, gradients and metrics sum to the full batch's;
- a gradient step on the value loss moves the values towards the returns.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from plasmid import testing
from plasmid.config import OptionParser
from plasmid.protocols import CriticLoss, Loss
from plasmid.types import LossBatch


def make_loss_batch(loss: Any, *, groups: int = 3, group_size: int = 4, response_length: int = 6,
                    seed: int = 0) -> LossBatch:
    """A random :class:`LossBatch` of ``groups * group_size`` samples, ``response_length`` tokens.

    Rewards differ within every group; responses have different lengths (right padding) and
    some have a masked hole in the middle (tool output). Reference log-probs and values are
    filled when ``loss`` needs them (reference log-probs also when it reads them from the samples,
    ``reference_logprobs_key``: plasmid-opd's teacher); ``advantages``/``returns`` come from ``loss.advantages``.
    """
    generator = torch.Generator().manual_seed(seed)
    batch_size = groups * group_size
    rewards = torch.randint(0, 3, (batch_size,), generator=generator).float()
    rewards[::group_size] = 3.0                     # no group has all-equal rewards
    group_index = torch.arange(groups).repeat_interleave(group_size)
    lengths = torch.randint(2, response_length + 1, (batch_size,), generator=generator)
    lengths[0] = response_length
    positions = torch.arange(response_length)
    response_mask = (positions < lengths.unsqueeze(-1)).float()
    response_mask[1::3, 1] = 0.0                    # a tool-output hole in every third sample

    def logprobs_like() -> torch.Tensor:
        return -torch.rand(batch_size, response_length, generator=generator) * 3 - 0.05

    batch = LossBatch(
        rewards=rewards,
        group_index=group_index,
        response_mask=response_mask,
        old_logprobs=logprobs_like(),
        ref_logprobs=logprobs_like() if loss.needs_ref or getattr(loss, "reference_logprobs_key", None) else None,
        rollout_logprobs=logprobs_like(),
        values=torch.randn(batch_size, response_length, generator=generator) if loss.needs_critic else None,
        total_tokens=int(response_mask.sum()),
        total_samples=batch_size,
    )
    batch.advantages, batch.returns = loss.advantages(batch)
    return batch


class LossContract:
    """Checks for a loss provider; subclasses set ``plugin`` and ``provider``."""

    plugin: Any = None
    provider: str = ""
    config_options: dict[str, Any] = {}

    @pytest.fixture
    def loss(self, tmp_path: Any) -> Any:
        config = testing.make_config(self.plugin, run_dir=tmp_path / "run", **self.config_options)
        return testing.build("loss", self.provider, self.plugin, config=config)

    @pytest.fixture
    def batch(self, loss: Any) -> LossBatch:
        return make_loss_batch(loss)

    @staticmethod
    def current_logprobs(batch: LossBatch, seed: int = 1, spread: float = 0.3) -> torch.Tensor:
        """Log-probs of a policy a little away from the old one, as a leaf tensor with gradient."""
        old_logprobs: torch.Tensor = batch.old_logprobs
        generator = torch.Generator().manual_seed(seed)
        noise = (torch.rand(old_logprobs.shape, generator=generator) * 2 - 1) * spread
        return (old_logprobs + noise).clamp(max=0.0).requires_grad_(True)

    @staticmethod
    def entropy(batch: LossBatch) -> torch.Tensor:
        generator = torch.Generator().manual_seed(2)
        return (torch.rand(batch.old_logprobs.shape, generator=generator) * 2).requires_grad_(True)

    def loss_and_grad(self, loss: Any, batch: LossBatch, logprobs: torch.Tensor,
                      entropy: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        logprobs = logprobs.detach().requires_grad_(True)
        value, metrics = loss.policy_loss(batch, logprobs, entropy)
        (grad,) = torch.autograd.grad(value, logprobs, allow_unused=True)
        if grad is None:
            grad = torch.zeros_like(logprobs)
        return value.detach(), grad, metrics

    # ---------------------------------------------------------------------------------------------

    def test_is_a_loss_with_boolean_flags(self, loss: Any) -> None:
        assert isinstance(loss, Loss)
        for flag in ("needs_ref", "needs_critic", "needs_old_logprobs"):
            assert isinstance(getattr(loss, flag), bool), f"{flag} must be a bool"

    def test_option_classes_are_declared_by_the_kernel_or_the_plugin(self, loss: Any) -> None:
        parser = OptionParser()
        testing.make_manager(self.plugin).addoption(parser)
        read = getattr(type(loss), "option_classes", ())       # optional: a loss may read no options
        undeclared = [cls.__qualname__ for cls in read if cls not in parser.option_classes]
        assert not undeclared, f"{self.provider} reads options that neither the kernel nor its plugin declares: " \
            f"{undeclared}; declare them in the plugin's plasmid_addoption with parser.add_options(...)"

    def test_advantages_are_batch_by_tokens_and_zero_where_masked(self, loss: Any, batch: LossBatch) -> None:
        advantages = batch.advantages
        assert tuple(advantages.shape) == tuple(batch.response_mask.shape)
        assert torch.isfinite(advantages).all()
        assert torch.all(advantages[batch.response_mask == 0] == 0)
        assert advantages[batch.response_mask > 0].abs().sum() > 0, "advantages are all zero on a batch " \
            "whose groups have different rewards"
        if batch.returns is not None:
            assert tuple(batch.returns.shape) == tuple(batch.response_mask.shape)

    def test_policy_loss_is_a_finite_scalar_with_finite_gradients(self, loss: Any, batch: LossBatch) -> None:
        logprobs = self.current_logprobs(batch)
        value, grad, metrics = self.loss_and_grad(loss, batch, logprobs, self.entropy(batch))
        assert value.dim() == 0 and torch.isfinite(value)
        assert torch.isfinite(grad).all() and grad.abs().sum() > 0
        assert all(isinstance(v, float) and math.isfinite(v) for v in metrics.values()), metrics

    def test_masked_logprobs_change_neither_loss_nor_gradient(self, loss: Any, batch: LossBatch) -> None:
        logprobs = self.current_logprobs(batch)
        masked = batch.response_mask == 0
        assert masked.any()
        scrambled = logprobs.detach().clone()
        scrambled[masked] = torch.linspace(-30.0, 5.0, int(masked.sum()))
        entropy = self.entropy(batch)
        value, grad, _ = self.loss_and_grad(loss, batch, logprobs, entropy)
        value_scrambled, grad_scrambled, _ = self.loss_and_grad(loss, batch, scrambled, entropy)
        assert torch.allclose(value, value_scrambled, atol=1e-6, rtol=1e-6)
        assert torch.allclose(grad, grad_scrambled, atol=1e-7, rtol=1e-6)
        assert torch.all(grad_scrambled[masked] == 0)

    def test_micro_batch_losses_sum_to_the_full_batch_loss(self, loss: Any, batch: LossBatch) -> None:
        logprobs = self.current_logprobs(batch)
        entropy = self.entropy(batch).detach()
        value, grad, metrics = self.loss_and_grad(loss, batch, logprobs, entropy)
        split = batch.response_mask.shape[0] // 3
        first, second = torch.arange(0, split), torch.arange(split, batch.response_mask.shape[0])
        value_1, grad_1, metrics_1 = self.loss_and_grad(loss, batch.select(first), logprobs[first], entropy[first])
        value_2, grad_2, metrics_2 = self.loss_and_grad(loss, batch.select(second), logprobs[second],
                                                        entropy[second])
        assert_additive((value, grad, metrics), (value_1, grad_1, metrics_1), (value_2, grad_2, metrics_2))

    def test_first_update_favours_positive_advantage_tokens(self, loss: Any, batch: LossBatch) -> None:
        logprobs = batch.old_logprobs.clone()
        _, grad, _ = self.loss_and_grad(loss, batch, logprobs, self.entropy(batch).detach())
        # a small step along -grad changes the log-probs by -lr * grad; their advantage-weighted
        # sum must go up
        assert float((-grad * batch.advantages * batch.response_mask).sum()) > 0

    # ---------------------------------------------------------------------------------------------
    # critic losses
    # ---------------------------------------------------------------------------------------------

    @staticmethod
    def current_values(batch: LossBatch, seed: int = 3, spread: float = 0.5) -> torch.Tensor:
        """Critic values a little away from the old ones, as a leaf tensor with gradient."""
        values: torch.Tensor = batch.values
        generator = torch.Generator().manual_seed(seed)
        noise = (torch.rand(values.shape, generator=generator) * 2 - 1) * spread
        return (values + noise).requires_grad_(True)

    def value_loss_and_grad(self, loss: Any, batch: LossBatch,
                            values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        values = values.detach().requires_grad_(True)
        value, metrics = loss.value_loss(batch, values)
        (grad,) = torch.autograd.grad(value, values, allow_unused=True)
        if grad is None:
            grad = torch.zeros_like(values)
        return value.detach(), grad, metrics

    @staticmethod
    def require_critic(loss: Any) -> None:
        if not loss.needs_critic:
            pytest.skip("the loss needs no critic")

    def test_a_critic_loss_has_value_loss_and_masked_returns(self, loss: Any, batch: LossBatch) -> None:
        self.require_critic(loss)
        assert isinstance(loss, CriticLoss), "a loss with needs_critic must implement value_loss(batch, values)"
        assert batch.returns is not None, "advantages() of a critic loss must return the critic's targets"
        assert tuple(batch.returns.shape) == tuple(batch.response_mask.shape)
        assert torch.isfinite(batch.returns).all()
        assert torch.all(batch.returns[batch.response_mask == 0] == 0)

    def test_value_loss_is_finite_and_ignores_masked_values(self, loss: Any, batch: LossBatch) -> None:
        self.require_critic(loss)
        values = self.current_values(batch)
        value, grad, metrics = self.value_loss_and_grad(loss, batch, values)
        assert value.dim() == 0 and torch.isfinite(value)
        assert torch.isfinite(grad).all() and grad.abs().sum() > 0
        assert all(isinstance(v, float) and math.isfinite(v) for v in metrics.values()), metrics
        masked = batch.response_mask == 0
        scrambled = values.detach().clone()
        scrambled[masked] = torch.linspace(-30.0, 30.0, int(masked.sum()))
        value_scrambled, grad_scrambled, _ = self.value_loss_and_grad(loss, batch, scrambled)
        assert torch.allclose(value, value_scrambled, atol=1e-6, rtol=1e-6)
        assert torch.allclose(grad, grad_scrambled, atol=1e-7, rtol=1e-6)
        assert torch.all(grad_scrambled[masked] == 0)

    def test_micro_batch_value_losses_sum_to_the_full_batch(self, loss: Any, batch: LossBatch) -> None:
        self.require_critic(loss)
        values = self.current_values(batch)
        value, grad, metrics = self.value_loss_and_grad(loss, batch, values)
        split = batch.response_mask.shape[0] // 3
        first, second = torch.arange(0, split), torch.arange(split, batch.response_mask.shape[0])
        value_1, grad_1, metrics_1 = self.value_loss_and_grad(loss, batch.select(first), values[first])
        value_2, grad_2, metrics_2 = self.value_loss_and_grad(loss, batch.select(second), values[second])
        assert_additive((value, grad, metrics), (value_1, grad_1, metrics_1), (value_2, grad_2, metrics_2))

    def test_value_gradient_step_moves_values_towards_returns(self, loss: Any, batch: LossBatch) -> None:
        self.require_critic(loss)
        _, grad, _ = self.value_loss_and_grad(loss, batch, batch.values.clone())
        # a small step along -grad changes the values by -lr * grad; they must approach the returns
        assert float((-grad * (batch.returns - batch.values) * batch.response_mask).sum()) > 0


def assert_additive(whole: tuple[torch.Tensor, torch.Tensor, dict[str, float]],
                    first: tuple[torch.Tensor, torch.Tensor, dict[str, float]],
                    second: tuple[torch.Tensor, torch.Tensor, dict[str, float]]) -> None:
    """The ``(loss, gradient, metrics)`` of a batch equal the sums (gradients: the concatenation)
    of its two halves' (micro-batch losses are normalised by the whole batch's totals)."""
    value, grad, metrics = whole
    (value_1, grad_1, metrics_1), (value_2, grad_2, metrics_2) = first, second
    assert torch.allclose(value_1 + value_2, value, atol=1e-6, rtol=1e-5)
    assert torch.allclose(torch.cat([grad_1, grad_2]), grad, atol=1e-7, rtol=1e-5)
    assert set(metrics_1) == set(metrics) == set(metrics_2)
    for name in metrics:
        assert math.isclose(metrics_1[name] + metrics_2[name], metrics[name], rel_tol=1e-5, abs_tol=1e-6), name
