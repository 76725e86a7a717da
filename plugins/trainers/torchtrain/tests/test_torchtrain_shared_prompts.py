"""Samples that share a prompt share its forward pass (``response_logprobs(share_prompts=True)``,
and the critic's ``response_values``): the same log-probs, entropy, values and gradients as one
pass over the whole sequences, to float rounding, from a prompt pass over the distinct prompts and
a response pass on their copied KV cache."""

from __future__ import annotations

import random

import pytest
import torch
from plasmid_torchtrain import batching, critic

from plasmid.types import Sample
from plasmid_torch.hf import load_causal_lm
from plasmid_torch.tiny import build_tiny_model


@pytest.fixture(scope="module", params=["qwen2", "llama", "qwen3_moe"])
def model(request, tmp_path_factory):
    return load_causal_lm(str(build_tiny_model(tmp_path_factory.mktemp(request.param) / "model",
                                               arch=request.param, seed=3)))


def grouped_samples(vocab: int, seed: int = 0) -> list[Sample]:
    """Three prompts (4, 6 and 7 tokens) with 3, 2 and 4 samples, interleaved; responses of 1-4
    tokens, one with a partial loss mask."""
    rng = random.Random(seed)
    prompts = [[1] + [rng.randrange(3, vocab) for _ in range(length - 1)] for length in (4, 6, 7)]
    order = [0, 1, 2, 0, 2, 1, 2, 0, 2]
    samples = []
    for index, which in enumerate(order):
        response = [rng.randrange(3, vocab) for _ in range(rng.randint(1, 4))]
        mask = [1] * len(response) if index != 4 else [0] + [1] * (len(response) - 1)
        samples.append(Sample(tokens=prompts[which] + response, response_length=len(response), loss_mask=mask,
                              index=index))
    return samples


def logprobs_and_grads(model, padded, share: bool):
    model.zero_grad()
    logprobs, entropy = batching.response_logprobs(model, padded, 0.8, with_entropy=True, share_prompts=share)
    (logprobs.sum() + entropy.sum()).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return logprobs.detach(), entropy.detach(), grads


def test_shared_prompt_passes_equal_one_pass_in_values_and_gradients(model):
    padded = batching.pad_samples(grouped_samples(model.config.vocab_size), pad_id=0)
    first, group = padded.prompt_groups()
    assert first.tolist() == [0, 1, 2] and group.tolist() == [0, 1, 2, 0, 2, 1, 2, 0, 2]
    rows_seen = []
    hook = model.register_forward_pre_hook(lambda module, args, kwargs: rows_seen.append(kwargs["input_ids"].shape),
                                           with_kwargs=True)
    try:
        shared = logprobs_and_grads(model, padded, share=True)
        assert rows_seen == [torch.Size([3, 7]), torch.Size([9, 3])]   # distinct prompts, then responses
        one = logprobs_and_grads(model, padded, share=False)
        assert rows_seen[2:] == [padded.input_ids.shape]
    finally:
        hook.remove()
    torch.testing.assert_close(shared[0], one[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(shared[1], one[1], rtol=0, atol=1e-5)
    assert shared[2].keys() == one[2].keys() and len(one[2]) > 10
    for name, grad in one[2].items():
        torch.testing.assert_close(shared[2][name], grad, rtol=1e-4, atol=1e-5, msg=name)


def test_distinct_prompts_and_one_token_responses(model):
    samples = grouped_samples(model.config.vocab_size, seed=1)
    distinct = batching.pad_samples(samples[:3], pad_id=0)
    assert distinct.prompt_groups() is None
    short = [Sample(tokens=s.prompt_tokens + s.response_tokens[:1], response_length=1) for s in samples]
    padded = batching.pad_samples(short, pad_id=0)                    # every response one token: no second pass
    with torch.no_grad():
        shared, _ = batching.response_logprobs(model, padded, 1.0, share_prompts=True)
        one, _ = batching.response_logprobs(model, padded, 1.0)
    torch.testing.assert_close(shared, one, rtol=0, atol=1e-5)


def test_a_model_without_a_config_takes_one_pass():
    class Wrapper:             # as the LoRA run's reference policy (lora.AdaptersDisabled)
        def __init__(self, inner):
            self.inner = inner

        def __call__(self, **kwargs):
            return self.inner(**kwargs)

    assert not batching._full_attention(Wrapper(None))


def test_the_critic_shares_prompt_passes_with_the_same_values_and_gradients(model):
    torch.manual_seed(0)
    value_model = critic.ValueModel(model.base_model, model.config.hidden_size)
    torch.nn.init.normal_(value_model.value_head.weight, std=0.01)     # a zero head gives the backbone no gradient
    padded = batching.pad_samples(grouped_samples(model.config.vocab_size, seed=2), pad_id=0)
    rows_seen = []
    hook = model.base_model.register_forward_pre_hook(
        lambda module, args, kwargs: rows_seen.append(kwargs["input_ids"].shape), with_kwargs=True)

    def values_and_grads(share):
        value_model.zero_grad()
        values = critic.response_values(value_model, padded, share_prompts=share)
        (values * torch.linspace(1, 2, values.shape[1])).sum().backward()
        return values.detach(), {name: p.grad.clone() for name, p in value_model.named_parameters()
                                 if p.grad is not None}

    try:
        shared = values_and_grads(True)
        assert rows_seen == [torch.Size([3, 7]), torch.Size([9, 3])]   # distinct prompts, then responses
        one = values_and_grads(False)
        assert rows_seen[2:] == [padded.input_ids.shape]
    finally:
        hook.remove()
    assert bool((shared[0][~padded.in_response] == 0).all()) and bool((shared[0][padded.in_response] != 0).all())
    torch.testing.assert_close(shared[0], one[0], rtol=0, atol=1e-5)
    assert shared[1].keys() == one[1].keys() and "value_head.weight" in one[1] and len(one[1]) > 10
    for name, grad in one[1].items():
        torch.testing.assert_close(shared[1][name], grad, rtol=1e-4, atol=1e-5, msg=name)

