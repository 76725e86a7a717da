"""Log-probs from last hidden states in chunks (plasmid_torch.lm_head): the model's own logits'
numbers, forward and backward, with at most one chunk of logits alive; the head of models whose
logits are transformed (Gemma's soft-capping)."""

from __future__ import annotations

import pytest
import torch

from plasmid_torch import lm_head, ops
from plasmid_torch.hf import load_causal_lm
from plasmid_torch.tiny import build_tiny_model


@pytest.fixture(scope="module", params=["qwen2", "llama", "qwen3_moe"])
def model(request, tmp_path_factory):
    return load_causal_lm(str(build_tiny_model(tmp_path_factory.mktemp(request.param) / "m", arch=request.param,
                                               seed=2)))


def test_head_of_the_last_hidden_states_is_the_models_logits(model):
    ids = torch.randint(3, model.config.vocab_size, (2, 9))
    with torch.no_grad():
        full = model(input_ids=ids).logits
        hidden = lm_head.last_hidden(model(input_ids=ids, **lm_head.HIDDEN_ONLY))
    head = lm_head.LMHead.of(model)
    assert head is lm_head.LMHead.of(model) and head.vocab_size == model.config.vocab_size
    torch.testing.assert_close(head.logits(hidden), full.float(), rtol=0, atol=1e-6)


def test_chunks_give_one_pieces_values_and_gradients(model, monkeypatch):
    ids = torch.randint(3, model.config.vocab_size, (3, 12))
    tokens = torch.randint(3, model.config.vocab_size, (36,))
    head = lm_head.LMHead.of(model)

    def run(chunk_elements: int):
        monkeypatch.setattr(lm_head, "LOGITS_CHUNK_ELEMENTS", chunk_elements)
        model.zero_grad()
        hidden = lm_head.last_hidden(model(input_ids=ids, **lm_head.HIDDEN_ONLY)).reshape(36, -1)
        logprobs, entropy = lm_head.token_logprobs(head, hidden, tokens, 0.9, with_entropy=True)
        (logprobs.sum() * 2 + entropy.sum()).backward()
        return logprobs.detach(), entropy.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                                     if p.grad is not None}

    whole = run(1 << 30)
    chunked = run(head.vocab_size * 5)                           # 8 chunks of 5 tokens (the last of 1)
    torch.testing.assert_close(chunked[0], whole[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(chunked[1], whole[1], rtol=0, atol=1e-6)
    assert whole[2].keys() == chunked[2].keys() and len(whole[2]) > 5
    for name, grad in whole[2].items():
        torch.testing.assert_close(chunked[2][name], grad, rtol=1e-4, atol=1e-5, msg=name)
    with torch.no_grad():
        logits = model(input_ids=ids).logits.reshape(36, -1)
    torch.testing.assert_close(whole[0], ops.logprobs_from_logits(logits, tokens, 0.9), rtol=0, atol=1e-5)
    torch.testing.assert_close(whole[1], ops.entropy_from_logits(logits, 0.9), rtol=0, atol=1e-5)


def test_a_chunked_backward_recomputes_instead_of_keeping_logits(monkeypatch):
    """With 16 chunks, what autograd keeps between forward and backward is about the hidden states,
    not ``[N, V]`` logits (measured by the saved tensors' bytes)."""
    torch.manual_seed(0)
    vocab, width, count = 4096, 16, 512
    head = lm_head.LMHead(torch.nn.Linear(width, vocab, bias=False), config=object())
    hidden = torch.randn(count, width, requires_grad=True)
    tokens = torch.randint(0, vocab, (count,))
    saved: list[int] = []

    def pack(tensor):
        saved.append(tensor.numel() * tensor.element_size())
        return tensor

    monkeypatch.setattr(lm_head, "LOGITS_CHUNK_ELEMENTS", vocab * count // 16)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        logprobs, entropy = lm_head.token_logprobs(head, hidden, tokens, 1.0, with_entropy=True)
    logits_bytes = count * vocab * 4
    assert sum(saved) < logits_bytes / 4, (sum(saved), logits_bytes)
    (logprobs.sum() + entropy.sum()).backward()
    assert hidden.grad is not None and head.module.weight.grad is not None


def test_soft_capped_logits_are_capped_as_the_model_caps_them():
    transformers = pytest.importorskip("transformers")
    config = transformers.Gemma2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                       num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                                       final_logit_softcapping=3.0)
    torch.manual_seed(0)
    model = transformers.Gemma2ForCausalLM(config).eval()
    torch.nn.init.normal_(model.lm_head.weight, std=2.0)
    ids = torch.randint(0, 64, (1, 6))
    with torch.no_grad():
        full = model(input_ids=ids).logits
        hidden = lm_head.last_hidden(model(input_ids=ids, **lm_head.HIDDEN_ONLY))
        head = lm_head.LMHead.of(model)
        assert head.softcap == 3.0 and full.abs().max() <= 3.0
        torch.testing.assert_close(head.logits(hidden), full.float(), rtol=0, atol=1e-5)
