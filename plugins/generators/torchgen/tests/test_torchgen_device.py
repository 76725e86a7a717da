"""torchgen's --device and --precision on the CPU (the GPU path runs in benchmarks/gpu_check.py)."""

from __future__ import annotations

import numpy as np
import plasmid_torchgen.plugin
import pytest
import torch

from plasmid.errors import UsageError
from plasmid.testing import build, make_config, run
from plasmid.types import SamplingParams
from plasmid_torch.tiny import BOS_ID, build_tiny_model

NAME = "model.layers.0.mlp.up_proj.weight"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("torchgen-device") / "tiny", seed=0)


def make_engine(model_dir, tmp_path, **options):
    torch.set_num_threads(1)
    config = make_config(plasmid_torchgen.plugin, run_dir=tmp_path / "run", model=str(model_dir), **options)
    return build("engine", "torchgen", plasmid_torchgen.plugin, config=config)


def test_cuda_without_a_gpu_is_a_one_line_error_naming_the_engine(model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UsageError, match=r"^engine 'torchgen' \(plugin plasmid-torchgen\): --device cuda, but "):
        make_engine(model_dir, tmp_path, device="cuda")


def test_the_default_serves_float32_on_the_cpu(model_dir, tmp_path):
    engine = make_engine(model_dir, tmp_path)
    try:
        assert engine.place.device == torch.device("cpu")
        assert {p.dtype for p in engine.model.parameters()} == {torch.float32}
    finally:
        run(engine.shutdown())


def test_bf16_serves_bfloat16_weights_and_a_bfloat16_kv_cache(model_dir, tmp_path, monkeypatch):
    engine = make_engine(model_dir, tmp_path, precision="bf16")
    try:
        assert {p.dtype for p in engine.model.parameters()} == {torch.bfloat16}
        caches = []
        forward = engine._decoder._forward

        def spy(input_ids, attention_mask, positions, cache):
            caches.append(cache)
            return forward(input_ids, attention_mask, positions, cache)

        monkeypatch.setattr(engine._decoder, "_forward", spy)
        out = run(engine.generate([BOS_ID, 4, 5, 6], SamplingParams(temperature=1.0, max_new_tokens=6, seed=1)))
        assert len(out.token_ids) >= 1 and all(np.isfinite(out.logprobs)) and all(v <= 0 for v in out.logprobs)
        assert caches and caches[0].layers[0].keys.dtype == torch.bfloat16
        # a float32 tensor from an fp32 trainer loads (cast to bf16); reads come back as float32 numpy
        update = torch.full(tuple(engine.model.get_parameter(NAME).shape), 0.5)
        run(engine.update_weights([(NAME, update)], 1))
        read = run(engine.get_weights([NAME]))[NAME]
        assert read.dtype == np.float32 and np.all(read == 0.5)
    finally:
        run(engine.shutdown())


def test_bf16_autocast_keeps_float32_weights_and_decodes_in_bfloat16(model_dir, tmp_path, monkeypatch):
    engine = make_engine(model_dir, tmp_path, precision="bf16-autocast")
    try:
        assert {p.dtype for p in engine.model.parameters()} == {torch.float32}
        seen = []
        engine.model.model.layers[0].mlp.up_proj.register_forward_hook(lambda m, a, out: seen.append(out.dtype))
        run(engine.generate([BOS_ID, 4, 5, 6], SamplingParams(temperature=0.0, max_new_tokens=3)))
        scored = run(engine.score([BOS_ID, 4, 5, 6, 7], 3, 1.0))
        assert len(scored) == 2 and seen and set(seen) == {torch.bfloat16}
    finally:
        run(engine.shutdown())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: a device machine runs it")
def test_a_gpu_engine_samples_on_the_gpu_and_brings_back_only_tokens(model_dir, tmp_path, monkeypatch):
    import plasmid_torchgen.decoder as decoder_module

    engine = make_engine(model_dir, tmp_path, device="cuda")
    seen = []
    sample = decoder_module.sample_tokens

    def spy(logits, sampling, shared_generator):
        tokens, logprobs = sample(logits, sampling, shared_generator)
        seen.append((logits.device.type, shared_generator.device.type, tokens.device.type))
        return tokens, logprobs

    monkeypatch.setattr(decoder_module, "sample_tokens", spy)
    try:
        mixed = [SamplingParams(temperature=1.0, max_new_tokens=5), SamplingParams(temperature=0.0, max_new_tokens=5),
                 SamplingParams(temperature=0.8, top_p=0.9, top_k=4, max_new_tokens=5, seed=3)]
        outputs = run(engine.generate_many([[BOS_ID, 4, 5]] * 3, mixed))
        again = run(engine.generate([BOS_ID, 4, 5], mixed[2]))
        assert seen and set(seen) == {("cuda", "cuda", "cuda")}
        assert all(len(o.token_ids) == 5 and all(v <= 0 for v in o.logprobs) for o in outputs)
        assert again.token_ids == outputs[2].token_ids  # a seeded row draws alike whatever shares its batch
    finally:
        run(engine.shutdown())
