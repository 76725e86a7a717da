"""Vocabulary-parallel log-probs and entropy (one rank here; two ranks in test_megatron_parallel.py)."""

from __future__ import annotations

import pytest
import torch
from plasmid_megatron.vocab_parallel import vocab_parallel_logprobs

from plasmid_torch import ops


@pytest.mark.parametrize("temperature", [1.0, 0.6, 0.0])
def test_one_rank_equals_the_engines_math_with_gradients(temperature):
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11, dtype=torch.float64).float().requires_grad_()
    targets = torch.randint(0, 11, (3, 5))
    logprobs, entropy = vocab_parallel_logprobs(logits, targets, temperature=temperature, vocab_start=0,
                                                vocab_size=11, with_entropy=True)
    expected_logprobs = ops.logprobs_from_logits(logits, targets, temperature)
    expected_entropy = ops.entropy_from_logits(logits, temperature)
    assert torch.allclose(logprobs, expected_logprobs, atol=1e-6)
    assert torch.allclose(entropy, expected_entropy, atol=1e-6)

    weights = torch.randn(3, 5)
    grad, = torch.autograd.grad((logprobs * weights).sum() + (entropy * weights).sum(), logits)
    expected, = torch.autograd.grad((expected_logprobs * weights).sum() + (expected_entropy * weights).sum(), logits)
    assert torch.allclose(grad, expected, atol=1e-6)


def test_padding_columns_are_left_out_of_the_softmax_and_get_no_gradient():
    torch.manual_seed(1)
    real = torch.randn(4, 7)
    padded = torch.cat([real, torch.full((4, 9), 50.0)], dim=-1).requires_grad_()   # padding would dominate
    targets = torch.tensor([0, 3, 6, 2])
    logprobs, entropy = vocab_parallel_logprobs(padded, targets, temperature=1.0, vocab_start=0, vocab_size=7,
                                                with_entropy=True)
    assert torch.allclose(logprobs, ops.logprobs_from_logits(real, targets), atol=1e-6)
    assert torch.allclose(entropy, ops.entropy_from_logits(real), atol=1e-6)
    (logprobs.sum() + entropy.sum()).backward()
    assert torch.isfinite(padded.grad).all() and not padded.grad[:, 7:].any()
