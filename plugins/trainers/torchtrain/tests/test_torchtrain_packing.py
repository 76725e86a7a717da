"""Packed micro-batches (``response_logprobs(pack=True)``, the critic's ``response_values``): the
samples in one row without padding, attention within each sample (plasmid_torch.packing), give the
padded pass's log-probs, entropy, values, loss and gradients within 1e-5 in float32; so do groups
packed with their shared prompt once (``packing.pack_shared``); and the pass with the fewest token
positions is the one taken."""

from __future__ import annotations

import random

import pytest
import torch
from plasmid_torchtrain import batching, critic

from plasmid.types import Sample
from plasmid_torch import packing
from plasmid_torch.hf import load_causal_lm
from plasmid_torch.tiny import build_tiny_model


@pytest.fixture(scope="module", params=["qwen2", "llama", "qwen3_moe"])
def model_dir(request, tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp(request.param) / "model", arch=request.param, seed=5)


@pytest.fixture(scope="module")
def model(model_dir):
    loaded = load_causal_lm(str(model_dir))
    assert packing.enable(loaded) and packing.attention_of(loaded) == packing.VARLEN
    return loaded


def ragged_samples(vocab: int, seed: int = 0) -> list[Sample]:
    """Six samples of distinct prompts (2-9 tokens) and responses of 1-20 tokens (lengths vary
    10x), two with partial loss masks."""
    rng = random.Random(seed)
    samples = []
    for index, (prompt_length, response_length) in enumerate([(2, 20), (9, 1), (5, 12), (3, 2), (7, 18), (4, 6)]):
        prompt = [1] + [rng.randrange(3, vocab) for _ in range(prompt_length - 1)]
        response = [rng.randrange(3, vocab) for _ in range(response_length)]
        mask = [1] * response_length
        if index in (2, 4):
            mask[1] = 0
        samples.append(Sample(tokens=prompt + response, response_length=response_length, loss_mask=mask,
                              reward=float(index % 2), index=index, group_index=index // 2))
    return samples


def grouped_samples(vocab: int, seed: int = 0) -> list[Sample]:
    """Three groups (prompts of 2, 9 and 5 tokens) of 3, 1 and 4 samples whose responses are 1-20
    tokens, one with a partial loss mask, in group order as a rollout gives them."""
    rng = random.Random(seed)
    samples = []
    for group, (prompt_length, responses) in enumerate([(2, [20, 1, 7]), (9, [3]), (5, [12, 2, 18, 6])]):
        prompt = [1] + [rng.randrange(3, vocab) for _ in range(prompt_length - 1)]
        for response_length in responses:
            response = [rng.randrange(3, vocab) for _ in range(response_length)]
            mask = [1] * response_length
            if response_length == 12:
                mask[1] = 0
            samples.append(Sample(tokens=prompt + response, response_length=response_length, loss_mask=mask,
                                  reward=float(len(samples) % 2), index=len(samples), group_index=group))
    return samples


def loss_and_grads(model, samples, padded, pack: bool):
    """A policy-gradient loss of ``padded`` (advantages reward - 0.5, an entropy bonus), with its
    log-probs, entropy and gradients."""
    model.zero_grad()
    logprobs, entropy = batching.response_logprobs(model, padded, 0.7, with_entropy=True, pack=pack)
    advantages = (torch.tensor([sample.reward for sample in samples]) - 0.5).unsqueeze(1)
    mask = padded.response_mask
    value = -((advantages * logprobs + 0.01 * entropy) * mask).sum() / mask.sum()
    value.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return value.detach(), logprobs.detach(), entropy.detach(), grads


def assert_one_packed_call_equals_the_padded_pass(model, samples, padded, fed: int) -> None:
    """``response_logprobs(pack=True)`` makes one forward call of ``fed`` positions, and its loss,
    log-probs, entropy and every gradient equal the padded pass's within 1e-5."""
    calls = []
    hook = model.register_forward_pre_hook(lambda module, args, kwargs: calls.append(kwargs["input_ids"].shape),
                                           with_kwargs=True)
    try:
        packed = loss_and_grads(model, samples, padded, pack=True)
        one = loss_and_grads(model, samples, padded, pack=False)
    finally:
        hook.remove()
    assert calls == [torch.Size([1, fed]), padded.input_ids.shape]
    for got, want in zip(packed[:3], one[:3], strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert packed[3].keys() == one[3].keys() and len(one[3]) > 10
    for name, grad in one[3].items():
        torch.testing.assert_close(packed[3][name], grad, rtol=0, atol=1e-5, msg=name)


def test_packed_pass_equals_the_padded_pass_in_values_loss_and_gradients(model):
    samples = ragged_samples(model.config.vocab_size)
    padded = batching.pad_samples(samples, pad_id=0)
    assert batching.choose_pass(padded, None, pack=True) == "packed"
    assert_one_packed_call_equals_the_padded_pass(model, samples, padded, sum(len(s.tokens) - 1 for s in samples))


def test_groups_packed_with_their_prompt_once_equal_the_padded_pass(model):
    samples = grouped_samples(model.config.vocab_size)
    padded = batching.pad_samples(samples, pad_id=0)
    groups = padded.prompt_groups()
    assert batching.choose_pass(padded, groups, pack=True, share_cache=False, pack_shared=True) == "packed-shared"
    fed = (2 + 9 + 5) + sum(s.response_length - 1 for s in samples)      # each prompt once
    assert_one_packed_call_equals_the_padded_pass(model, samples, padded, fed)


def test_responses_sharing_a_prompt_never_attend_to_each_other(model):
    """A sample's log-probs packed after its group's prompt, beside its group's other responses,
    equal its log-probs alone; and the masks say the same."""
    samples = grouped_samples(model.config.vocab_size, seed=2)
    with torch.no_grad():
        together, _ = batching.response_logprobs(model, batching.pad_samples(samples, pad_id=0), 1.0, pack=True)
        for row, sample in enumerate(samples):
            alone, _ = batching.response_logprobs(model, batching.pad_samples([sample], pad_id=0), 1.0, pack=False)
            width = sample.response_length
            torch.testing.assert_close(together[row, :width], alone[0, :width], rtol=0, atol=1e-5)
    packed = packing.pack_shared([([1, 2], [[3, 4], [], [5]])])
    assert packed["position_ids"].tolist() == [[0, 1, 2, 3, 2]]
    assert packed[packing.GROUP_MASKS][0][0, 0].int().tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0],
                                                                  [1, 1, 1, 1, 0], [1, 1, 0, 0, 1]]
    with pytest.raises(ValueError, match="non-empty prompts"):
        packing.pack_shared([([], [[1]])])


def test_samples_never_attend_to_each_other(model):
    """A sample's log-probs packed beside others equal its log-probs alone."""
    samples = ragged_samples(model.config.vocab_size, seed=1)
    with torch.no_grad():
        together, _ = batching.response_logprobs(model, batching.pad_samples(samples, pad_id=0), 1.0, pack=True)
        for row, sample in enumerate(samples):
            alone, _ = batching.response_logprobs(model, batching.pad_samples([sample], pad_id=0), 1.0, pack=False)
            width = sample.response_length
            torch.testing.assert_close(together[row, :width], alone[0, :width], rtol=0, atol=1e-5)


def test_critic_values_packed_equal_padded(model_dir):
    value_model = critic.load_value_model(model_dir)
    torch.nn.init.normal_(value_model.value_head.weight, std=0.5)
    assert packing.enable(value_model.backbone)
    padded = batching.pad_samples(ragged_samples(value_model.backbone.config.vocab_size), pad_id=0)
    with torch.no_grad():
        packed = critic.response_values(value_model, padded, pack=True)
        one = critic.response_values(value_model, padded, pack=False)
    assert packed.abs().sum() > 0
    torch.testing.assert_close(packed, one, rtol=0, atol=1e-5)


def test_the_pass_with_fewest_token_positions_is_chosen():
    def batch(prompt: int, responses: list[int], shared: bool) -> batching.PaddedBatch:
        samples = [Sample(tokens=[1 + (0 if shared else i)] * prompt + [5] * length, response_length=length)
                   for i, length in enumerate(responses)]
        return batching.pad_samples(samples, pad_id=0)

    ragged = batch(4, [1, 30, 2, 3], shared=False)          # padded 4 x 34 = 136, packed 3+32+4+5 = 44
    assert batching.choose_pass(ragged, None, pack=True) == "packed"
    assert batching.choose_pass(ragged, None, pack=False) == "padded"
    group = batch(8, [2] * 8, shared=True)                  # padded 80, packed 72, shared 8 + 8 = 16
    assert batching.choose_pass(group, group.prompt_groups(), pack=True) == "shared"
    long_answers = batch(3, [2, 40, 3, 5], shared=True)     # padded 172, packed 54, shared 3 + 156
    assert batching.choose_pass(long_answers, long_answers.prompt_groups(), pack=True) == "packed"
    # packed-shared 3 + 46 = 49 < packed 54; with a cache's shared pass allowed too, still the fewest
    assert batching.choose_pass(long_answers, long_answers.prompt_groups(), pack=True,
                                pack_shared=True) == "packed-shared"
    # a tie (8 + 8 each) goes to packed-shared: one forward call, no cache
    assert batching.choose_pass(group, group.prompt_groups(), pack=True, pack_shared=True) == "packed-shared"
    assert batching.choose_pass(group, group.prompt_groups(), pack=False, pack_shared=False) == "shared"


def test_eager_attention_and_sliding_windows_are_not_packed(tmp_path):
    eager = load_causal_lm(str(build_tiny_model(tmp_path / "m", seed=1)))
    eager.set_attn_implementation("eager")
    assert not packing.enable(eager) and packing.attention_of(eager) == "eager"
    padded = batching.pad_samples(ragged_samples(eager.config.vocab_size), pad_id=0)
    calls = []
    eager.register_forward_pre_hook(lambda module, args, kwargs: calls.append(kwargs["input_ids"].shape),
                                    with_kwargs=True)
    with torch.no_grad():
        batching.response_logprobs(eager, padded, 1.0, pack=True)
    assert calls == [padded.input_ids.shape]


def test_pack_refuses_an_empty_sequence():
    with pytest.raises(ValueError, match="non-empty"):
        packing.pack([[1, 2], []])


def test_micro_batches_keep_within_the_token_budget():
    from plasmid_torchtrain.distributed import DataParallel, token_budget_runs

    lengths = [5, 9, 3, 20, 4, 4, 2]
    assert token_budget_runs(range(7), 256, lengths, 12) == [[0], [1, 2], [3], [4, 5, 6]]
    assert token_budget_runs(range(7), 2, lengths, 12) == [[0], [1, 2], [3], [4, 5], [6]]
    assert token_budget_runs(range(7), 3) == [[0, 1, 2], [3, 4, 5], [6]]
    two = [DataParallel(rank, 2) for rank in (0, 1)]     # shards rows 0-3 and 4-6
    got = [[m.tolist() for m in dp.micro_batches(7, 256, lengths=lengths, max_tokens=12, equal=True)] for dp in two]
    assert got == [[[0], [1, 2], [3]], [[4, 5, 6], [], []]]


def test_the_trainer_cuts_micro_batches_by_tokens(model_dir, tmp_path):
    import plasmid_grpo.plugin
    import plasmid_torchtrain.plugin

    from plasmid import testing
    from plasmid_torch.testing.contracts.trainer import make_rollout_batch

    def trainer(**options):
        config = testing.make_config(plasmid_torchtrain.plugin, plasmid_grpo.plugin, model=str(model_dir), lr=1e-3,
                                     run_dir=tmp_path / "run", **options)
        loss = testing.build("loss", "grpo", plasmid_grpo.plugin, config=config)
        return testing.build("trainer", "torchtrain", plasmid_torchtrain.plugin, config=config, args=(loss,))

    batch = make_rollout_batch(16)
    budget = max(len(sample.tokens) for sample in batch.samples) + 2
    limited, whole = trainer(max_tokens_per_micro_batch=budget), trainer()
    sizes: list[int] = []
    limited.model.register_forward_pre_hook(
        lambda module, args, kwargs: sizes.append(int(kwargs["cu_seq_lens_q"][-1]) if "cu_seq_lens_q" in kwargs
                                                  else int(kwargs["attention_mask"].sum())), with_kwargs=True)
    got, want = testing.run(limited.train_step(batch)), testing.run(whole.train_step(batch))
    assert len(sizes) >= len(batch.samples) // 2 and max(sizes) <= budget
    assert got["train/loss"] == pytest.approx(want["train/loss"], rel=1e-5, abs=1e-7)
    assert got["train/grad_norm"] == pytest.approx(want["train/grad_norm"], rel=1e-4)


def test_where_a_kv_cache_may_share_prompts_it_does_and_the_prompt_is_not_packed_once(model):
    """With ``share_prompts`` (no gradient checkpointing) the two cache passes run: on small models
    they beat one packed pass that calls SDPA per group; ``pack_shared`` stands in only without it."""
    samples = [sample for sample in grouped_samples(model.config.vocab_size) if sample.group_index != 1]
    for sample in samples:          # two-token answers: the cache's pass is among the cheapest
        prompt = sample.tokens[:len(sample.tokens) - sample.response_length]
        sample.tokens, sample.response_length, sample.loss_mask = [*prompt, 5, 6 + sample.index], 2, [1, 1]
    padded = batching.pad_samples(samples, pad_id=0)
    calls = []
    hook = model.register_forward_pre_hook(lambda module, args, kwargs: calls.append(packing.GROUP_MASKS in kwargs),
                                           with_kwargs=True)
    try:
        with torch.no_grad():
            cached, _ = batching.response_logprobs(model, padded, 1.0, pack=True, share_prompts=True)
            assert calls == [False, False]
            packed, _ = batching.response_logprobs(model, padded, 1.0, pack=True, share_prompts=False)
            assert calls[2:] == [True]
    finally:
        hook.remove()
    torch.testing.assert_close(cached, packed, rtol=0, atol=1e-5)
