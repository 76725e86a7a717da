"""Hugging Face <-> megatron weights: bit-exact round trips per family and tensor-parallel size, and
megatron's log-probs equal Hugging Face transformers' for the same weights and tokens."""

from __future__ import annotations

import json

import plasmid_grpo.plugin
import plasmid_megatron.plugin
import pytest
import torch
from plasmid_megatron.converter import Converter
from plasmid_megatron.model_spec import UnsupportedModel, read_model_spec, spec_from_config

from plasmid import testing
from plasmid_torch.hf import load_causal_lm
from plasmid_torch.testing.contracts.trainer import exported, make_rollout_batch
from plasmid_torch.tiny import build_tiny_model, char_tokenizer

VOCAB = 16
FAMILIES = {
    "qwen2-tied": dict(arch="qwen2"),                                   # 4 heads, 4 groups
    "llama-untied": dict(arch="llama", tie_word_embeddings=False, num_kv_heads=2),   # 2 heads a group
    "qwen3": None,     # built below: q/k norms and head_dim != hidden / heads
}


def build_tiny_qwen3(directory):
    import transformers

    config = transformers.Qwen3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=24,
                                      max_position_embeddings=64, tie_word_embeddings=False, bos_token_id=1,
                                      eos_token_id=2, pad_token_id=0, rope_theta=5000.0)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():      # random norm weights, so that a swapped q/k norm would show
        for name, tensor in model.named_parameters():
            if "norm" in name:
                tensor.uniform_(0.5, 1.5)
    model.save_pretrained(directory)
    char_tokenizer().save_pretrained(directory)
    return directory


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def model_dir(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp("converter") / request.param
    if FAMILIES[request.param] is None:
        return build_tiny_qwen3(directory)
    return build_tiny_model(directory, **FAMILIES[request.param])


def make_trainer(model_dir, tmp_path, **options):
    config = testing.make_config(plasmid_megatron.plugin, plasmid_grpo.plugin, trainer="megatron", lr=1e-3,
                                 model=str(model_dir), run_dir=tmp_path / "run", **options)
    loss = testing.build("loss", "grpo", plasmid_grpo.plugin, config=config)
    return testing.build("trainer", "megatron", plasmid_megatron.plugin, config=config, args=(loss,))


def hf_state(model_dir):
    model = load_causal_lm(str(model_dir))
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tp_size", [1, 2])
def test_shards_merge_back_bit_exactly(model_dir, tmp_path, tp_size):
    spec = read_model_spec(model_dir)
    hf = hf_state(model_dir)
    trainer = make_trainer(model_dir, tmp_path)
    names = [name for name, _ in trainer.model.module.named_parameters()]
    converter = Converter(spec, tp_size, spec.padded_vocab_size(128, tp_size))
    rebuilt = {}
    for name in names:
        rule = converter.rule(name)
        shards = [converter.shard(rule, hf, rank) for rank in range(tp_size)]
        assert all(shard.shape == shards[0].shape for shard in shards), name
        if rule.exported:
            rebuilt.update(converter.merge(rule, shards))
    expected = {name for name in hf if not (spec.tie_word_embeddings and name == "lm_head.weight")}
    assert set(rebuilt) == expected
    for name, tensor in rebuilt.items():
        assert torch.equal(tensor, hf[name]), name


def test_qkv_shards_are_whole_query_groups(model_dir):
    """Rank r's fused QKV rows are the rows of groups [r g/t, (r+1) g/t) of the full layout."""
    spec = read_model_spec(model_dir)
    hf = hf_state(model_dir)
    full = Converter(spec, 1, spec.padded_vocab_size(128, 1))
    rule = full.rule("decoder.layers.1.self_attention.linear_qkv.weight")
    fused = full.shard(rule, hf, 0)
    assert fused.shape == ((spec.num_heads + 2 * spec.num_kv_heads) * spec.head_dim, spec.hidden_size)
    group = (spec.heads_per_group + 2) * spec.head_dim
    first_group = fused[:group]
    assert torch.equal(first_group[: spec.heads_per_group * spec.head_dim],
                       hf["model.layers.1.self_attn.q_proj.weight"][: spec.heads_per_group * spec.head_dim])
    assert torch.equal(first_group[-2 * spec.head_dim: -spec.head_dim],
                       hf["model.layers.1.self_attn.k_proj.weight"][: spec.head_dim])
    if spec.num_kv_heads % 2 == 0:
        halves = Converter(spec, 2, spec.padded_vocab_size(128, 2))
        assert torch.equal(torch.cat([halves.shard(rule, hf, 0), halves.shard(rule, hf, 1)]), fused)


def test_gate_up_shards_hold_both_halves_of_their_rows(model_dir):
    spec = read_model_spec(model_dir)
    hf = hf_state(model_dir)
    converter = Converter(spec, 2, spec.padded_vocab_size(128, 2))
    shard = converter.shard(converter.rule("decoder.layers.0.mlp.linear_fc1.weight"), hf, 1)
    rows = spec.ffn_hidden_size // 2
    assert torch.equal(shard[:rows], hf["model.layers.0.mlp.gate_proj.weight"][rows:])
    assert torch.equal(shard[rows:], hf["model.layers.0.mlp.up_proj.weight"][rows:])


def test_vocabulary_is_padded_with_zero_rows_and_unpadded_on_export(model_dir):
    spec = read_model_spec(model_dir)
    hf = hf_state(model_dir)
    converter = Converter(spec, 2, spec.padded_vocab_size(128, 2))
    rule = converter.rule("embedding.word_embeddings.weight")
    shards = [converter.shard(rule, hf, rank) for rank in range(2)]
    assert [s.shape[0] for s in shards] == [128, 128]
    assert torch.equal(shards[0][:VOCAB], hf["model.embed_tokens.weight"])
    assert not shards[0][VOCAB:].any() and not shards[1].any()
    assert converter.merge(rule, shards)[0][1].shape[0] == VOCAB


def test_megatron_model_exports_the_hf_checkpoint_bit_exactly(model_dir, tmp_path):
    hf = hf_state(model_dir)
    spec = read_model_spec(model_dir)
    weights = exported(make_trainer(model_dir, tmp_path))
    expected = {name for name in hf if not (spec.tie_word_embeddings and name == "lm_head.weight")}
    assert set(weights) == expected
    for name, value in weights.items():
        assert (hf[name].numpy() == value).all(), name


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_megatron_logprobs_equal_transformers(model_dir, tmp_path, temperature):
    samples = make_rollout_batch(VOCAB, groups=3).samples
    got = testing.run(make_trainer(model_dir, tmp_path, micro_batch_size=4).logprobs(samples, temperature))
    reference = load_causal_lm(str(model_dir))
    for sample, values in zip(samples, got, strict=True):
        with torch.no_grad():
            logits = reference(input_ids=torch.tensor([sample.tokens])).logits[0].float() / temperature
        expected = torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(sample.tokens[1:]).unsqueeze(-1))
        expected = expected.squeeze(-1)[-sample.response_length:]
        assert torch.allclose(torch.tensor(values), expected, atol=1e-5, rtol=0), (values, expected.tolist())


# ------------------------------------------------------------------------------------------------
# what is refused
# ------------------------------------------------------------------------------------------------


def tiny_config_dict(**changes):
    config = {"model_type": "qwen2", "vocab_size": 16, "hidden_size": 64, "intermediate_size": 256,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_act": "silu",
              "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
    config.update(changes)
    return config


@pytest.mark.parametrize(("changes", "reason"), [
    ({"model_type": "gpt2"}, "model_type 'gpt2' is not supported"),
    ({"model_type": "qwen2_vl", "vision_config": {"depth": 2}}, "'qwen2_vl' is a vision-language model.*torchtrain"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({"model_type": "llama", "attention_bias": True}, "attention_bias"),
    ({"use_sliding_window": True}, "sliding-window"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "rope_type 'yarn'"),
])
def test_configs_it_cannot_reproduce_are_refused_with_the_reason(changes, reason):
    with pytest.raises(UnsupportedModel, match=reason):
        spec_from_config(tiny_config_dict(**changes))


def test_legacy_rope_theta_key_is_read():
    config = tiny_config_dict(rope_theta=500000.0)
    del config["rope_parameters"]
    assert spec_from_config(config).rope_theta == 500000.0


def test_tensor_parallel_size_must_divide_the_key_value_heads(tmp_path):
    spec = spec_from_config(tiny_config_dict(num_key_value_heads=1))
    with pytest.raises(ValueError, match="must divide the model's 1 key/value heads"):
        Converter(spec, 2, spec.padded_vocab_size(128, 2))


def test_unsupported_model_is_a_usage_error_naming_the_file(tmp_path):
    from plasmid.errors import UsageError

    directory = tmp_path / "gpt2"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(tiny_config_dict(model_type="gpt2")))
    with pytest.raises(UsageError, match=r"megatron: .*config.json: model_type 'gpt2'"):
        make_trainer(directory, tmp_path)
