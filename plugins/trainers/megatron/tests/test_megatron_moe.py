"""Mixture-of-experts models (qwen2_moe, qwen3_moe) in the megatron trainer: weights in and out
bit-exactly (one process, and the expert-/tensor-parallel split as tensor arithmetic), log-probs
equal to transformers' for both router orders (``norm_topk_prob``), a training step that moves the
router, the experts and the shared expert, and an expert-parallel run (2 processes over gloo) that
equals the single-process run."""

from __future__ import annotations

import json

import numpy as np
import plasmid_grpo.plugin
import plasmid_megatron.plugin
import pytest
import torch
from plasmid_megatron import checkpoint
from plasmid_megatron.converter import Converter
from plasmid_megatron.model import transformer_config
from plasmid_megatron.model_spec import UnsupportedModel, read_model_spec, spec_from_config
from plasmid_megatron.moe import check_options
from plasmid_megatron.parallel import ParallelSizes
from safetensors.torch import load_file
from test_megatron_parallel import COMPARED, checkpoint_weights, run_layout

from plasmid import testing
from plasmid.errors import UsageError
from plasmid_torch.hf import load_causal_lm
from plasmid_torch.testing.contracts.trainer import exported, make_rollout_batch
from plasmid_torch.tiny import build_tiny_model, char_tokenizer, tiny_config

VOCAB = 16
#: name -> (tiny arch, config overrides); every model has 4 experts, top-2
MODELS = {
    "qwen2_moe": ("qwen2_moe", {}),
    "qwen2_moe-norm": ("qwen2_moe", {"norm_topk_prob": True}),
    "qwen3_moe": ("qwen3_moe", {}),
    "qwen3_moe-norm": ("qwen3_moe", {"norm_topk_prob": True}),
    # layers 0 and 2 dense (intermediate_size), layer 1 sparse: megatron's integer moe_layer_freq would differ
    "qwen2_moe-sparse-step": ("qwen2_moe", {"decoder_sparse_step": 2, "num_hidden_layers": 3}),
}


def build_moe_model(directory, arch, **overrides):
    """A tiny MoE model with decisive routing: router weights and experts scaled up from
    transformers' std 0.02 initialisation, so that the router order, the top-k choice and the
    experts change the log-probs by far more than the tolerances used here."""
    import transformers

    config = tiny_config(VOCAB, arch=arch, num_kv_heads=2, tie_word_embeddings=False, **overrides)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                tensor.mul_(40.0)
            elif ".mlp.experts." in name or "shared_expert" in name:
                tensor.mul_(10.0)
            elif "norm" in name:
                tensor.uniform_(0.5, 1.5)
    model.save_pretrained(directory)
    char_tokenizer().save_pretrained(directory)
    return directory


@pytest.fixture(scope="module", params=sorted(MODELS))
def model_dir(request, tmp_path_factory):
    arch, overrides = MODELS[request.param]
    return build_moe_model(tmp_path_factory.mktemp("moe") / request.param, arch, **overrides)


def make_trainer(model_dir, tmp_path, **options):
    options = {"trainer": "megatron", "lr": 1e-3, "model": str(model_dir), "run_dir": tmp_path / "run", **options}
    config = testing.make_config(plasmid_megatron.plugin, plasmid_grpo.plugin, **options)
    loss = testing.build("loss", "grpo", plasmid_grpo.plugin, config=config)
    return testing.build("trainer", "megatron", plasmid_megatron.plugin, config=config, args=(loss,))


def checkpoint_tensors(model_dir):
    """The Hugging Face checkpoint's tensors as saved (one per expert; transformers 5 fuses them
    into ``experts.gate_up_proj`` when it loads a model)."""
    return load_file(str(model_dir / "model.safetensors"))


def hf_logprobs(model_dir, samples, norm_topk_prob=None):
    """transformers' log-probs of each sample's response tokens (with the routers' ``norm_topk_prob``
    switched when given)."""
    reference = load_causal_lm(str(model_dir))
    if norm_topk_prob is not None:
        routers = [module for module in reference.modules() if hasattr(module, "norm_topk_prob")]
        assert routers
        for router in routers:
            router.norm_topk_prob = norm_topk_prob
    rows = []
    for sample in samples:
        with torch.no_grad():
            logits = reference(input_ids=torch.tensor([sample.tokens])).logits[0].float()
        picked = torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(sample.tokens[1:]).unsqueeze(-1))
        rows.append(picked.squeeze(-1)[-sample.response_length:])
    return rows


# ------------------------------------------------------------------------------------------------
# what the config maps to
# ------------------------------------------------------------------------------------------------


def test_moe_config_fields(model_dir):
    spec = read_model_spec(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    kwargs = spec.transformer_config_kwargs()
    assert spec.is_moe and kwargs["num_moe_experts"] == 4 and kwargs["moe_router_topk"] == 2
    assert kwargs["moe_ffn_hidden_size"] == config["moe_intermediate_size"]
    # softmax over all experts then top-k without renormalising == megatron's pre-softmax order
    assert kwargs["moe_router_pre_softmax"] is (not config["norm_topk_prob"])
    step = config.get("decoder_sparse_step", 1)
    assert kwargs["moe_layer_freq"] == [int((layer + 1) % step == 0) for layer in range(config["num_hidden_layers"])]
    shared = spec.family == "qwen2_moe"
    assert kwargs["moe_shared_expert_gate"] is shared
    assert kwargs["moe_shared_expert_intermediate_size"] == (config["shared_expert_intermediate_size"] if shared
                                                             else None)
    assert kwargs["add_qkv_bias"] is shared and kwargs["qk_layernorm"] is (not shared)


# ------------------------------------------------------------------------------------------------
# weights in and out
# ------------------------------------------------------------------------------------------------


def test_single_process_round_trip_and_export_are_bit_exact(model_dir, tmp_path):
    hf = checkpoint_tensors(model_dir)
    spec = read_model_spec(model_dir)
    trainer = make_trainer(model_dir, tmp_path)
    names = [name for name, _ in trainer.model.module.named_parameters()]
    assert any(".mlp.experts.local_experts.3.linear_fc2." in name for name in names)
    converter = Converter(spec, 1, spec.padded_vocab_size(128, 1))
    rebuilt = {}
    for name in names:
        rule = converter.rule(name)
        rebuilt.update(converter.merge(rule, [converter.shard(rule, hf, 0)]))
    assert set(rebuilt) == set(hf)
    assert all(torch.equal(tensor, hf[name]) for name, tensor in rebuilt.items())
    weights = exported(trainer)
    assert set(weights) == set(hf)
    for name, value in weights.items():
        assert (hf[name].numpy() == value).all(), name


@pytest.mark.parametrize(("ep_size", "tp_size", "etp_size"), [(2, 2, None), (2, 2, 1), (4, 1, None)])
def test_expert_and_tensor_parallel_shards_merge_back_bit_exactly(model_dir, tmp_path, ep_size, tp_size, etp_size):
    """Each expert-parallel rank's local experts, split over the expert-tensor-parallel ranks (the
    tensor-parallel ones by default), merge back into every Hugging Face tensor exactly once."""
    hf = checkpoint_tensors(model_dir)
    spec = read_model_spec(model_dir)
    single = [name for name, _ in make_trainer(model_dir, tmp_path).model.module.named_parameters()]
    converter = Converter(spec, tp_size, spec.padded_vocab_size(128, tp_size), ep_size=ep_size, etp_size=etp_size)
    local = converter.local_experts
    # megatron's names on an expert-parallel rank: local experts 0 .. E/ep - 1
    names = [name for name in single if ".local_experts." not in name
             or int(name.split(".local_experts.")[1].split(".")[0]) < local]
    rebuilt: dict[str, torch.Tensor] = {}
    for ep_rank in range(ep_size):
        for name in names:
            rule = converter.rule(name, 0, ep_rank)
            if not rule.expert and ep_rank:
                continue            # replicated over expert-parallel ranks: exported once
            shards = [converter.shard(rule, hf, rank, rank) for rank in range(converter.parts(rule))]
            assert len({shard.shape for shard in shards}) == 1, name
            if rule.expert and "linear_fc1" in name:
                assert shards[0].shape[0] == 2 * spec.moe_ffn_hidden_size // (etp_size or tp_size)
            merged = converter.merge(rule, shards)
            assert not set(dict(merged)) & set(rebuilt), name
            rebuilt.update(merged)
    assert set(rebuilt) == set(hf)
    assert all(torch.equal(tensor, hf[name]) for name, tensor in rebuilt.items())


def test_expert_shards_are_the_right_experts_and_rows(model_dir):
    hf = checkpoint_tensors(model_dir)
    spec = read_model_spec(model_dir)
    converter = Converter(spec, 2, spec.padded_vocab_size(128, 2), ep_size=2)
    layer = spec.moe_layers.index(True)
    rule = converter.rule(f"decoder.layers.{layer}.mlp.experts.local_experts.1.linear_fc1.weight", 0, 1)
    prefix = f"model.layers.{layer}.mlp.experts.3."          # rank 1 holds experts 2, 3
    assert rule.expert and rule.hf_names == (prefix + "gate_proj.weight", prefix + "up_proj.weight")
    rows = spec.moe_ffn_hidden_size // 2
    shard = converter.shard(rule, hf, 0, 1)                   # expert-tensor-parallel rank 1: second halves
    assert torch.equal(shard, torch.cat([hf[prefix + "gate_proj.weight"][rows:], hf[prefix + "up_proj.weight"][rows:]]))
    down = converter.shard(converter.rule(f"decoder.layers.{layer}.mlp.experts.local_experts.1.linear_fc2.weight",
                                          0, 1), hf, 0, 1)
    assert torch.equal(down, hf[prefix + "down_proj.weight"][:, rows:])
    router = converter.shard(converter.rule(f"decoder.layers.{layer}.mlp.router.weight", 0, 1), hf, 1)
    assert torch.equal(router, hf[f"model.layers.{layer}.mlp.gate.weight"])     # replicated


# ------------------------------------------------------------------------------------------------
# log-probs and training
# ------------------------------------------------------------------------------------------------


def test_megatron_logprobs_equal_transformers(model_dir, tmp_path):
    samples = make_rollout_batch(VOCAB, groups=3).samples
    got = testing.run(make_trainer(model_dir, tmp_path, micro_batch_size=4).logprobs(samples, 1.0))
    expected = hf_logprobs(model_dir, samples)
    for values, reference in zip(got, expected, strict=True):
        assert torch.allclose(torch.tensor(values), reference, atol=1e-5, rtol=0), (values, reference.tolist())
    # the router order matters for this model: the other norm_topk_prob is 10x outside the tolerance or more
    norm = json.loads((model_dir / "config.json").read_text())["norm_topk_prob"]
    other = hf_logprobs(model_dir, samples, norm_topk_prob=not norm)
    assert max((a - b).abs().max().item() for a, b in zip(other, expected, strict=True)) > 1e-4


def test_a_train_step_moves_router_experts_and_shared_expert(tmp_path):
    model = build_moe_model(tmp_path / "model", "qwen2_moe")
    trainer = make_trainer(model, tmp_path, megatron_optimizer="sgd", lr=0.05)
    before = exported(trainer)
    metrics = testing.run(trainer.train_step(make_rollout_batch(VOCAB, groups=3, seed=5)))
    assert metrics["train/grad_norm"] > 0
    after = exported(trainer)
    moved = {name for name in before if not np.array_equal(before[name], after[name])}
    for layer in range(2):
        prefix = f"model.layers.{layer}.mlp."
        assert {prefix + "gate.weight", prefix + "shared_expert_gate.weight"} <= moved
        assert {prefix + f"shared_expert.{p}_proj.weight" for p in ("gate", "up", "down")} <= moved
        assert {prefix + f"experts.{e}.{p}_proj.weight" for e in range(4) for p in ("gate", "up", "down")} <= moved


# ------------------------------------------------------------------------------------------------
# expert parallelism over two processes
# ------------------------------------------------------------------------------------------------


def test_expert_parallel_run_matches_a_single_process(tmp_path):
    """EP=2 (each rank holds 2 of the 4 experts, tokens exchanged all-to-all) against one process.
    Updates of 5 samples in micro-batches of 2 give the two data-parallel ranks 2 and 1 micro-batches:
    the rank with fewer runs a stand-in so that the all-to-alls pair up."""
    model = build_moe_model(tmp_path / "model", "qwen2_moe")
    options = {"micro_batch_size": 2, "global_batch_size": 5}
    expected = run_layout(model, tmp_path / "single", 1, options=options)
    got = run_layout(model, tmp_path / "ep2", 2, options={**options, "expert_model_parallel_size": 2})
    for values, reference in zip(got["logprobs"], expected["logprobs"], strict=True):
        assert np.allclose(values, reference, atol=1e-5, rtol=0)
    for step in ("first", "second"):
        assert got[step]["train/updates"] == 3
        for name in COMPARED:
            assert got[step][name] == pytest.approx(expected[step][name], rel=1e-4, abs=1e-6), (step, name)
    assert got["exported_names"] == expected["exported_names"]
    weights, expected_weights = checkpoint_weights(tmp_path / "ep2"), checkpoint_weights(tmp_path / "single")
    assert set(weights) == set(expected_weights) == set(checkpoint_tensors(model))
    for name, value in expected_weights.items():      # SGD steps of ~1e-2 per weight
        assert np.allclose(weights[name], value, atol=1e-5, rtol=0), name
    assert checkpoint.read_common(tmp_path / "ep2" / "ckpt")["trainer"]["layout"]["ep"] == 2


# ------------------------------------------------------------------------------------------------
# what is refused
# ------------------------------------------------------------------------------------------------


def moe_config_dict(**changes):
    config = {"model_type": "qwen3_moe", "vocab_size": 16, "hidden_size": 64, "intermediate_size": 256,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_act": "silu",
              "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
    config.update(changes)
    return config


@pytest.mark.parametrize(("changes", "reason"), [
    ({"attention_bias": True}, "attention_bias"),
    ({"num_experts_per_tok": 5}, "num_experts_per_tok 5"),
    ({"model_type": "qwen2_moe", "shared_expert_intermediate_size": 0}, "shared_expert_intermediate_size 0"),
    ({"use_sliding_window": True}, "sliding-window"),
])
def test_moe_configs_it_cannot_reproduce_are_refused(changes, reason):
    with pytest.raises(UnsupportedModel, match=reason):
        spec_from_config(moe_config_dict(**changes))


def test_mlp_only_layers_and_no_experts_are_dense_layers():
    assert spec_from_config(moe_config_dict(mlp_only_layers=[0])).moe_layers == (False, True)
    dense = spec_from_config(moe_config_dict(num_experts=0))
    assert not dense.is_moe and "num_moe_experts" not in dense.transformer_config_kwargs()


@pytest.mark.parametrize(("option", "value"), [("moe_router_score_function", "sigmoid"),
                                               ("moe_expert_capacity_factor", 1.0), ("moe_grouped_gemm", True),
                                               ("moe_router_enable_expert_bias", True)])
def test_native_options_that_change_routing_are_refused(option, value):
    spec = spec_from_config(moe_config_dict())
    with pytest.raises(ValueError, match="--megatron-" + option.replace("_", "-")):
        check_options(spec, {option: value})
    check_options(spec, {"moe_router_dtype": "fp32", "moe_z_loss_coeff": 1e-3})     # routing unchanged


def test_expert_parallel_size_must_divide_the_experts():
    spec = spec_from_config(moe_config_dict())
    with pytest.raises(ValueError, match="must divide the model's 4 experts"):
        Converter(spec, 1, 128, ep_size=3)


def test_expert_parallelism_of_a_dense_model_is_a_usage_error(tmp_path):
    dense = build_tiny_model(tmp_path / "dense")
    with pytest.raises(UsageError, match="--expert-model-parallel-size 2 needs a mixture-of-experts model"):
        make_trainer(dense, tmp_path, expert_model_parallel_size=2)


def test_tensor_parallel_experts_without_transformer_engine_are_refused():
    """megatron trains MoE layers over tensor-parallel ranks only with sequence parallelism, which
    its local (non-TransformerEngine) norms refuse."""
    spec = spec_from_config(moe_config_dict())
    with pytest.raises(ValueError, match="needs sequence parallelism"):
        transformer_config(spec, ParallelSizes(tp=2), {"transformer_impl": "local"})
