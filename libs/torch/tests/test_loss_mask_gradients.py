"""Tokens with ``loss_mask`` 0 (a multi-turn sample's tool output) contribute nothing to the policy
loss, its KL term or its entropy term: checked with gradients through a real (tiny) causal LM.

The samples are laid out as the multi-turn generate function leaves them: prompt, model turn
(mask 1), tool answer (mask 0), model turn (mask 1), and a trailing tool answer (mask 0).
"""

from __future__ import annotations

import pytest
import torch

from plasmid import hookimpl
from plasmid.testing import make_config
from plasmid.types import LossBatch, Sample, Status
from plasmid_torch.loss_options import PolicyGradientOptions
from plasmid_torch.ops import entropy_from_logits, logprobs_from_logits
from plasmid_torch.policy_gradient import PolicyGradientLoss
from plasmid_torch.tiny import tiny_config
from plasmid_torch.training import pad_rows, response_mask

VOCAB = 24


class Declares:
    @hookimpl
    def plasmid_addoption(self, parser):
        parser.add_options(PolicyGradientOptions)


class CenteredLoss(PolicyGradientLoss):
    """Advantages: the reward minus the batch mean, on every trained token."""

    def estimate_advantages(self, batch):
        rewards = self.shaped_rewards(batch)
        return (rewards - rewards.mean()).unsqueeze(1) * batch.response_mask, None


def model(seed: int):
    import transformers

    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(tiny_config(VOCAB, hidden_size=32, num_layers=1,
                                                                     num_heads=2, max_positions=64)).float()


def multiturn_samples() -> list[Sample]:
    """Two samples: [prompt | model | tool | model | tool], masks 1 on model tokens only."""
    samples = []
    for index, (model_a, tool_a, model_b, tool_b, reward) in enumerate([
        ([5, 6, 7], [10, 11], [8, 9], [12, 13, 14], 1.0),
        ([7, 5], [11, 10, 12], [6, 6, 9], [13], 0.0),
    ]):
        response = model_a + tool_a + model_b + tool_b
        mask = [1] * len(model_a) + [0] * len(tool_a) + [1] * len(model_b) + [0] * len(tool_b)
        rollout = [-0.1 * (i + 1) if m else 0.0 for i, m in enumerate(mask)]
        samples.append(Sample(prompt="", tokens=[1, 3, 4] + response, response_length=len(response), loss_mask=mask,
                              rollout_logprobs=rollout, reward=reward, status=Status.TRUNCATED, index=index,
                              group_index=0, weight_version=0))
    return samples


def forward(policy, samples, width):
    """``(logprobs, entropy)`` ``[B, width]`` of each sample's response tokens (leaves kept for grads)."""
    rows_lp, rows_ent = [], []
    for sample in samples:
        tokens = torch.tensor([sample.tokens])
        logits = policy(tokens).logits[0, sample.prompt_length - 1:-1]
        response = tokens[0, sample.prompt_length:]
        pad = width - sample.response_length
        rows_lp.append(torch.nn.functional.pad(logprobs_from_logits(logits, response), (0, pad)))
        rows_ent.append(torch.nn.functional.pad(entropy_from_logits(logits), (0, pad)))
    logprobs, entropy = torch.stack(rows_lp), torch.stack(rows_ent)
    if logprobs.requires_grad:
        logprobs.retain_grad()
        entropy.retain_grad()
    return logprobs, entropy


def loss_and_grads(samples, *, old_shift=None, ref_shift=None, rollout_shift=None, shift_at=None, **options):
    """The loss, the policy's parameter gradient and the gradients of the per-token log-probs and
    entropy; the ``*_shift``s are added to those log-probs where ``shift_at`` (default: masked)."""
    config = make_config(Declares(), kl_loss_coef=0.3, entropy_coef=0.05, max_new_tokens=16, **options)
    loss_fn = CenteredLoss(config)
    policy, reference = model(0), model(1)
    width = max(s.response_length for s in samples)
    mask = response_mask(samples, width)
    with torch.no_grad():
        ref = forward(reference, samples, width)[0].detach()
        old = forward(policy, samples, width)[0].detach() - 0.05
    rollout = pad_rows([s.rollout_logprobs for s in samples], width)
    masked = mask == 0 if shift_at is None else shift_at
    for shift, tensor in ((old_shift, old), (ref_shift, ref), (rollout_shift, rollout)):
        if shift is not None:
            tensor[masked] += shift
    batch = LossBatch(rewards=torch.tensor([s.reward for s in samples]), group_index=torch.zeros(len(samples)),
                      response_mask=mask, old_logprobs=old, ref_logprobs=ref, rollout_logprobs=rollout,
                      total_tokens=int(mask.sum()), total_samples=len(samples))
    batch.advantages, _ = loss_fn.advantages(batch)
    logprobs, entropy = forward(policy, samples, width)
    loss, _ = loss_fn.policy_loss(batch, logprobs, entropy)
    loss.backward()
    grads = torch.cat([p.grad.flatten() for p in policy.parameters() if p.grad is not None])
    return loss.detach(), grads, logprobs.grad, entropy.grad, mask


AGGREGATIONS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("loss_agg", AGGREGATIONS)
@pytest.mark.parametrize("kl_estimator", ["k1", "k3", "low-var-kl"])
def test_masked_tokens_get_no_gradient_from_the_loss_the_kl_or_the_entropy(loss_agg, kl_estimator):
    _, grads, logprob_grad, entropy_grad, mask = loss_and_grads(multiturn_samples(), loss_agg=loss_agg,
                                                                kl_estimator=kl_estimator, tis=True)
    masked, trained = mask == 0, mask == 1
    assert torch.count_nonzero(logprob_grad[masked]) == 0 and torch.count_nonzero(entropy_grad[masked]) == 0
    assert torch.count_nonzero(logprob_grad[trained]) > 0 and torch.count_nonzero(entropy_grad[trained]) > 0
    assert grads.abs().sum() > 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("loss_agg", AGGREGATIONS)
def test_changing_the_masked_tokens_log_probs_changes_neither_the_loss_nor_the_gradient(loss_agg):
    loss, grads, *_ = loss_and_grads(multiturn_samples(), loss_agg=loss_agg, tis=True)
    other_loss, other_grads, *_ = loss_and_grads(multiturn_samples(), loss_agg=loss_agg, tis=True, old_shift=-3.0,
                                                 ref_shift=4.0, rollout_shift=-2.5)
    assert torch.equal(loss, other_loss)
    assert torch.equal(grads, other_grads)


@pytest.mark.timeout(120)
def test_changing_the_ids_of_trailing_masked_tokens_does_not_change_the_gradient():
    samples = multiturn_samples()
    _, grads, *_ = loss_and_grads(samples)
    changed = multiturn_samples()
    for sample in changed:   # the trailing tool answer: no trained token comes after it
        tail = sample.loss_mask[::-1].index(1)
        sample.tokens[len(sample.tokens) - tail:] = [20] * tail
    assert changed[0].tokens != samples[0].tokens
    _, other_grads, *_ = loss_and_grads(changed)
    assert torch.allclose(grads, other_grads, rtol=0, atol=1e-7)


@pytest.mark.timeout(120)
def test_the_same_samples_without_the_mask_would_train_on_the_tool_tokens():
    """The check can fail: with every token trained on, shifting the tool tokens' log-probs
    changes the gradient."""
    tool_tokens = response_mask(multiturn_samples(), 10) == 0
    unmasked = multiturn_samples()
    for sample in unmasked:
        sample.loss_mask = [1] * sample.response_length
    _, grads, *_ = loss_and_grads(unmasked, shift_at=tool_tokens & (response_mask(unmasked, 10) > 0))
    _, other, *_ = loss_and_grads(unmasked, old_shift=-3.0, ref_shift=4.0,
                                  shift_at=tool_tokens & (response_mask(unmasked, 10) > 0))
    assert not torch.allclose(grads, other)
