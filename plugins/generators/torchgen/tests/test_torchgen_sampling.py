"""The per-row sampler draws from the right distribution and reports untruncated log-probs."""

import numpy as np
import torch
from plasmid_torchgen.sampling import SamplingBatch, sample_tokens

from plasmid.types import SamplingParams

torch.set_num_threads(1)

LOGITS = torch.tensor([2.0, 1.5, 0.5, -0.5, -3.0])
ROWS = 40_000


def draw(params, rows=ROWS, seed=0):
    sampling = SamplingBatch([params] * rows, [None] * rows)
    return sample_tokens(LOGITS.expand(rows, -1), sampling, torch.Generator().manual_seed(seed))


def frequencies(tokens):
    return np.bincount(tokens.numpy(), minlength=len(LOGITS)) / len(tokens)


def test_samples_follow_the_softmax_at_the_temperature():
    tokens, logprobs = draw(SamplingParams(temperature=0.7))
    expected = torch.softmax(LOGITS / 0.7, -1).numpy()
    np.testing.assert_allclose(frequencies(tokens), expected, atol=0.01)
    np.testing.assert_allclose(logprobs.exp().numpy(), expected[tokens.numpy()], rtol=1e-6)


def test_top_k_keeps_the_k_likeliest_renormalised_but_logprobs_are_untruncated():
    tokens, logprobs = draw(SamplingParams(temperature=1.0, top_k=2))
    probs = torch.softmax(LOGITS, -1).numpy()
    expected = np.zeros_like(probs)
    expected[:2] = probs[:2] / probs[:2].sum()
    np.testing.assert_allclose(frequencies(tokens), expected, atol=0.01)
    np.testing.assert_allclose(logprobs.numpy(), np.log(probs)[tokens.numpy()], rtol=1e-6)


def test_top_p_keeps_tokens_until_the_mass_before_them_reaches_p():
    probs = torch.softmax(LOGITS, -1).numpy()  # about [0.50, 0.30, 0.11, 0.04, 0.003]
    top_p = float(probs[:2].sum()) + 0.01  # the third token's mass-before is below p, the fourth's is not
    tokens, _ = draw(SamplingParams(temperature=1.0, top_p=top_p))
    expected = np.zeros_like(probs)
    expected[:3] = probs[:3] / probs[:3].sum()
    np.testing.assert_allclose(frequencies(tokens), expected, atol=0.01)


def test_greedy_rows_take_the_argmax_next_to_sampled_rows():
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=5.0)] * 500
    logits = LOGITS.expand(len(params), -1)
    tokens, logprobs = sample_tokens(logits, SamplingBatch(params, [None] * len(params)), torch.Generator())
    assert set(tokens[0::2].tolist()) == {0}
    assert len(set(tokens[1::2].tolist())) == len(LOGITS), "hot rows sample every token"
    np.testing.assert_allclose(logprobs[0::2].numpy(), torch.log_softmax(LOGITS, -1)[0].item(), rtol=1e-6)


def test_a_seeded_row_draws_the_same_token_whatever_shares_its_batch():
    seeded = SamplingParams(temperature=1.0, seed=11)

    def seeded_row_tokens(others):
        rows = others[:2] + [seeded] + others[2:]
        generators = [None if p.seed is None else torch.Generator().manual_seed(p.seed) for p in rows]
        sampling = SamplingBatch(rows, generators)
        logits = LOGITS.expand(len(rows), -1)
        shared = torch.Generator().manual_seed(len(others))
        return [sample_tokens(logits, sampling, shared)[0][len(others[:2])].item() for _ in range(30)]

    alone = seeded_row_tokens([])
    crowded = seeded_row_tokens([SamplingParams(temperature=1.0), SamplingParams(temperature=0.0),
                                 SamplingParams(temperature=2.0, seed=3, top_k=2)] * 3)
    assert alone == crowded
    assert len(set(alone)) > 1
