"""The lean decoding step (``--torchgen-decoder lean``) against the Hugging Face forward it replaces;
and ``--torchgen-cuda-graphs``: the fixed-address KV cache (``FixedKV``) and the fixed-shape step
that graphs record, run eagerly on the CPU (recording needs CUDA: a GPU-only test below, and
``benchmarks/gpu_check.py``, run it on a device machine)."""

from __future__ import annotations

import asyncio

import plasmid_torchgen.plugin
import pytest
import torch
from plasmid_torchgen import kv_cache
from plasmid_torchgen.batch import Request
from plasmid_torchgen.decoder import Decoder
from plasmid_torchgen.lean import LeanStep, unsupported_reason
from transformers import AutoModelForCausalLM

from plasmid.errors import UsageError
from plasmid.testing import make_config
from plasmid.types import SamplingParams
from plasmid_torch.device import Placement
from plasmid_torch.tiny import BOS_ID, build_tiny_model

ARCHS = [("qwen2", {}), ("llama", {"tie_word_embeddings": False}), ("qwen3", {}), ("qwen2", {"num_kv_heads": 2})]


def _model(directory, arch: str, **config):
    path = build_tiny_model(directory, arch=arch, seed=1, max_positions=512, **config)
    return AutoModelForCausalLM.from_pretrained(str(path)).eval()


def _prompts(count: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 9, (count,), generator=generator).tolist()
    return [[1] + torch.randint(3, 16, (length,), generator=generator).tolist() for length in lengths]


@pytest.mark.parametrize(("arch", "config"), ARCHS, ids=["qwen2", "llama", "qwen3", "qwen2-gqa"])
@pytest.mark.parametrize("rows", [1, 9])
def test_lean_step_logits_are_bit_identical_to_the_hf_decoding_step(tmp_path, arch, config, rows):
    model = _model(tmp_path / arch, arch, **config)
    lean = LeanStep(model)
    prompts = _prompts(rows, seed=rows)
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.inference_mode():
        cache = kv_cache.new_cache(model.config)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0),
                       cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
        static = kv_cache.StaticKV.from_dynamic(cache, room=2)  # so that reserve() reallocates mid-way
        tokens, positions = logits.argmax(-1, keepdim=True), mask.sum(1, keepdim=True)
        for _ in range(6):
            mask = torch.cat([mask, torch.ones(rows, 1, dtype=torch.int64)], 1)
            expected = model(input_ids=tokens, attention_mask=mask, position_ids=positions, cache=cache,
                             use_cache=True, logits_to_keep=1).logits[:, -1]
            static.reserve(1)
            got = lean(tokens, positions, mask, static)
            assert torch.equal(got, expected)
            assert static.columns == cache.get_seq_length()
            tokens, positions = expected.argmax(-1, keepdim=True), positions + 1


def _drive(decoder: Decoder, waves: dict[int, list[Request]]) -> int:
    """Steps ``decoder`` until every request finished, admitting ``waves[step]`` at each step."""
    batch, step, last = None, 0, max(waves)
    while batch is not None or step <= last:
        batch, _, _ = decoder.step(batch, waves.get(step, []))
        step += 1
    return step


def _requests(prompts: list[list[int]], loop, first_seed: int) -> list[Request]:
    requests = []
    for i, prompt in enumerate(prompts):
        params = SamplingParams(temperature=0.0 if i % 3 == 0 else 1.0, max_new_tokens=3 + (5 * i) % 11,
                                stop_token_ids=[2] if i % 2 else [], seed=first_seed + i, top_k=0 if i % 4 else 5)
        requests.append(Request.create(prompt, params, loop.create_future()))
    return requests


@pytest.mark.parametrize("reserve", [kv_cache.RESERVE_COLUMNS, 2])
def test_continuous_batching_gives_the_same_tokens_and_logprobs_with_either_decoder(tmp_path, monkeypatch, reserve):
    """Rows join mid-generation and leave at different steps (stop tokens, lengths): the lean
    decoder answers exactly what the HF decoder answers; a reserve of 2 columns regrows the
    buffers every other step."""
    monkeypatch.setattr(kv_cache, "RESERVE_COLUMNS", reserve)
    model = _model(tmp_path / "qwen2", "qwen2", num_kv_heads=2)
    loop = asyncio.new_event_loop()
    try:
        answers = {}
        for name in ("hf", "lean"):
            decoder = Decoder(model, torch.Generator().manual_seed(0), decoder=name)
            assert decoder.decoder == name
            waves = {0: _requests(_prompts(7, seed=0), loop, 0), 2: _requests(_prompts(5, seed=1), loop, 100),
                     5: _requests(_prompts(3, seed=2), loop, 200)}
            _drive(decoder, waves)
            answers[name] = [(r.token_ids, r.logprobs, r.status) for wave in waves.values() for r in wave]
        assert answers["lean"] == answers["hf"]
        assert len({len(tokens) for tokens, _, _ in answers["hf"]}) > 3  # rows really left at different steps
    finally:
        loop.close()


def test_static_kv_surgery_matches_the_dynamic_cache_surgery(tmp_path):
    model = _model(tmp_path / "qwen2", "qwen2")
    caches = []
    with torch.inference_mode():
        for rows, width in ((3, 5), (2, 8)):
            ids = torch.randint(3, 16, (rows, width))
            cache = kv_cache.new_cache(model.config)
            model(input_ids=ids, cache=cache, use_cache=True)
            caches.append(cache)
        statics = [kv_cache.StaticKV.from_dynamic(c, room=4) for c in caches]
        for first, second in (caches, statics):
            kv_cache.join_rows(first, second)
            kv_cache.select_rows(first, torch.tensor([4, 0, 3]))
            kv_cache.drop_leading_columns(first, 3)
        dynamic, static = caches[0], statics[0]
        assert static.columns == dynamic.get_seq_length() == 5 and static.capacity == 5 + 4
        for layer, keys, values in zip(dynamic.layers, static.keys, static.values, strict=True):
            assert torch.equal(keys[:, :, :static.columns], layer.keys)
            assert torch.equal(values[:, :, :static.columns], layer.values)


def test_an_architecture_without_a_lean_step_decodes_with_hf(make_engine, tmp_path):
    model_dir = build_tiny_model(tmp_path / "moe", arch="qwen2_moe", seed=0)
    engine = make_engine(model_dir)
    assert engine.decoder == "hf"
    assert "qwen2_moe" in engine._decoder.lean_unsupported
    with pytest.raises(ValueError, match="qwen2_moe"):
        LeanStep(engine.model)


def test_eager_attention_is_not_served_by_the_lean_step(tmp_path):
    path = build_tiny_model(tmp_path / "qwen2", seed=0)
    model = AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="eager")
    assert "eager" in unsupported_reason(model)


def test_decoder_option_picks_the_step_and_rejects_other_values(make_engine, tmp_path):
    model_dir = build_tiny_model(tmp_path / "qwen2", seed=0)
    assert make_engine(model_dir).decoder == "lean"
    assert make_engine(model_dir, torchgen_decoder="hf").decoder == "hf"
    with pytest.raises(UsageError, match="torchgen-decoder"):
        make_config(plasmid_torchgen.plugin, torchgen_decoder="fast")


@pytest.mark.parametrize("precision", ["bf16", "bf16-autocast"])
def test_lean_and_hf_decode_alike_in_bfloat16_on_the_cpu(tmp_path, precision):
    """The dtypes follow the Hugging Face step's (bf16 weights and cache; or float32 weights under
    bf16 autocast, where the cache holds float32 keys and bfloat16 values): the answers are equal."""
    place = Placement(torch.device("cpu"), precision)
    model = place.load_causal_lm(str(build_tiny_model(tmp_path / "qwen2", seed=2, num_kv_heads=2)))
    loop = asyncio.new_event_loop()
    try:
        answers = {}
        for name in ("hf", "lean"):
            decoder = Decoder(model, torch.Generator().manual_seed(0), place, decoder=name)
            assert decoder.decoder == name
            waves = {0: _requests(_prompts(6, seed=3), loop, 0), 3: _requests(_prompts(4, seed=4), loop, 50)}
            _drive(decoder, waves)
            answers[name] = [(r.token_ids, r.logprobs) for wave in waves.values() for r in wave]
        assert answers["lean"] == answers["hf"]
    finally:
        loop.close()


def _prefilled(model, rows: int, width: int, room: int, seed: int) -> kv_cache.StaticKV:
    generator = torch.Generator().manual_seed(seed)
    cache = kv_cache.new_cache(model.config)
    with torch.inference_mode():
        model(input_ids=torch.randint(3, 16, (rows, width), generator=generator), cache=cache, use_cache=True)
    return kv_cache.StaticKV.from_dynamic(cache, room=room)


def _addresses(cache: kv_cache.FixedKV) -> list[int]:
    return [buffer.data_ptr() for buffer in (*cache.key_buffers, *cache.value_buffers)]


def test_fixed_kv_surgery_equals_static_kv_surgery_and_keeps_its_buffers(tmp_path):
    model = _model(tmp_path / "qwen2", "qwen2", num_kv_heads=2)
    static, joining = _prefilled(model, 3, 5, 4, seed=0), _prefilled(model, 2, 8, 4, seed=1)
    with torch.inference_mode():
        fixed = kv_cache.FixedKV.of(_prefilled(model, 3, 5, 4, seed=0))
        assert fixed.slots == 4 and fixed.capacity == kv_cache.COLUMN_QUANTUM and fixed.rows == 3
        fixed.select_rows(torch.tensor([2, 0]))              # rows leave: the kept ones move to the front
        static.select_rows(torch.tensor([2, 0]))
        addresses = _addresses(fixed)
        kv_cache.join_rows(fixed, joining)                   # 2 + 2 rows fit in 4 slots; columns shift right
        kv_cache.join_rows(static, joining)
        kv_cache.select_rows(fixed, torch.tensor([3, 1, 2]))
        kv_cache.select_rows(static, torch.tensor([3, 1, 2]))
        kv_cache.drop_leading_columns(fixed, 2)
        kv_cache.drop_leading_columns(static, 2)
        assert _addresses(fixed) == addresses and fixed.generation == 0
        assert fixed.columns == static.columns == 6 and fixed.rows == 3
        for mine, theirs in zip((*fixed.keys, *fixed.values), (*static.keys, *static.values), strict=True):
            assert mine.shape[0] == 3 and torch.equal(mine[:, :, :6], theirs[:, :, :6])
        kv_cache.join_rows(fixed, _prefilled(model, 2, 3, 4, seed=2))    # 5 rows: reallocated to 8 slots
        assert fixed.slots == 8 and fixed.rows == 5 and fixed.generation == 1 and _addresses(fixed) != addresses
        fixed.reserve(fixed.capacity)                                    # more columns: reallocated again
        assert fixed.capacity == 2 * kv_cache.COLUMN_QUANTUM and fixed.generation == 2
        buffers = (*fixed.key_buffers, *fixed.value_buffers)
        assert all(bool(torch.isfinite(buffer).all()) for buffer in buffers)   # zeroed, never uninitialised


def test_the_fixed_shape_step_equals_the_lean_step_over_padded_rows(tmp_path):
    model = _model(tmp_path / "qwen3", "qwen3")
    lean = LeanStep(model)
    with torch.inference_mode():
        static = _prefilled(model, 3, 6, 8, seed=3)
        fixed = kv_cache.FixedKV.of(_prefilled(model, 3, 6, 8, seed=3))
        mask = torch.tensor([[0, 1, 1, 1, 1, 1], [1] * 6, [0, 0, 1, 1, 1, 1]])
        tokens, positions = torch.tensor([[4], [5], [6]]), mask.sum(1, keepdim=True)
        for _ in range(3):
            mask = torch.cat([mask, torch.ones(3, 1, dtype=torch.int64)], 1)
            expected = lean(tokens, positions, mask, static)
            column = fixed.columns
            padded = torch.zeros(4, 1, 1, fixed.capacity, dtype=torch.bool)    # 3 rows padded to 4
            padded[:3, 0, 0, :column + 1] = mask.bool()
            padded[3, 0, 0, 0] = True
            got = lean.fixed_shape(torch.cat([tokens, torch.zeros(1, 1, dtype=torch.int64)]),
                                   torch.cat([positions, torch.zeros(1, 1, dtype=torch.int64)]), padded,
                                   torch.tensor([column]), fixed.key_buffers, fixed.value_buffers)
            fixed.columns += 1
            torch.testing.assert_close(got[:3], expected, rtol=0, atol=2e-6)
            tokens, positions = expected.argmax(-1, keepdim=True), positions + 1


@pytest.mark.parametrize("reserve", [kv_cache.RESERVE_COLUMNS, 2])
def test_continuous_batching_through_the_graph_path_answers_as_the_lean_step(tmp_path, monkeypatch, reserve):
    """Rows join mid-generation and leave at different steps, the row count passes several powers
    of two, and (reserve 2) the buffers regrow: the same tokens, log-probs within float rounding."""
    monkeypatch.setattr(kv_cache, "RESERVE_COLUMNS", reserve)
    model = _model(tmp_path / "qwen2", "qwen2", num_kv_heads=2)
    fixed_steps = []
    fixed_shape = LeanStep.fixed_shape
    monkeypatch.setattr(LeanStep, "fixed_shape",
                        lambda self, tokens, *rest: fixed_steps.append(len(tokens)) or fixed_shape(self, tokens, *rest))
    loop = asyncio.new_event_loop()
    try:
        answers = {}
        for graphs in (False, True):
            decoder = Decoder(model, torch.Generator().manual_seed(0), decoder="lean", graphs=graphs)
            waves = {0: _requests(_prompts(7, seed=0), loop, 0), 2: _requests(_prompts(5, seed=1), loop, 100),
                     5: _requests(_prompts(3, seed=2), loop, 200)}
            steps = _drive(decoder, waves)
            answers[graphs] = [(r.token_ids, r.logprobs, r.status) for wave in waves.values() for r in wave]
        assert (bool(fixed_steps) and steps - 1 <= len(fixed_steps) <= steps
                and set(fixed_steps) <= {1, 2, 4, 8, 16})         # every decoding step, rows padded to 2^k
        assert len(set(fixed_steps)) >= 3
        for (tokens, logprobs, status), (lean_tokens, lean_logprobs, lean_status) in zip(
                answers[True], answers[False], strict=True):
            assert tokens == lean_tokens and status == lean_status
            assert logprobs == pytest.approx(lean_logprobs, abs=1e-6)
    finally:
        loop.close()


def test_cuda_graphs_need_a_gpu_and_the_lean_step(make_engine, tmp_path, monkeypatch):
    model_dir = build_tiny_model(tmp_path / "qwen2", seed=0)
    loaded = []
    monkeypatch.setattr(Placement, "load_causal_lm", lambda self, path: loaded.append(path))
    with pytest.raises(UsageError, match=r"--torchgen-cuda-graphs needs a GPU, but it serves on cpu"):
        make_engine(model_dir, torchgen_cuda_graphs=True)
    assert loaded == []                                  # refused before any weights were read
    monkeypatch.undo()
    # past the GPU check (a placement that says CUDA, the model still on the CPU): a step that is not
    # the lean one cannot be recorded
    monkeypatch.setattr(Placement, "is_cuda", property(lambda self: True))
    with pytest.raises(UsageError, match=r"replays the lean decoding step, which does not run here "
                                         r"\(--torchgen-decoder hf was chosen\)"):
        make_engine(model_dir, torchgen_cuda_graphs=True, torchgen_decoder="hf")
    moe_dir = build_tiny_model(tmp_path / "moe", arch="qwen2_moe", seed=0)
    with pytest.raises(UsageError, match=r"which does not run here \(model type 'qwen2_moe'"):
        make_engine(moe_dir, torchgen_cuda_graphs=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: a device machine runs it")
def test_recorded_graphs_replay_the_eager_steps(tmp_path):
    """On a GPU: graphs are recorded once per row count and replayed; answers equal the eager lean
    step's (greedy tokens; log-probs within float rounding)."""
    place = Placement(torch.device("cuda"))
    model = place.load_causal_lm(str(build_tiny_model(tmp_path / "qwen2", seed=0, num_kv_heads=2)))
    loop = asyncio.new_event_loop()
    try:
        answers, decoders = {}, {}
        for graphs in (False, True):
            decoders[graphs] = Decoder(model, torch.Generator("cuda").manual_seed(0), place, graphs=graphs)
            params = SamplingParams(temperature=0.0, max_new_tokens=12)
            requests = [Request.create([BOS_ID, 3 + i % 7, 4 + i % 5], params, loop.create_future(), "cuda")
                        for i in range(6)]
            _drive(decoders[graphs], {0: requests})
            answers[graphs] = [(r.token_ids, r.logprobs) for r in requests]
        runner = decoders[True]._graphs
        assert runner.captures >= 1 and runner.replays >= 5
        for (tokens, logprobs), (eager_tokens, eager_logprobs) in zip(answers[True], answers[False], strict=True):
            assert tokens == eager_tokens and logprobs == pytest.approx(eager_logprobs, abs=1e-4)
    finally:
        loop.close()


def test_a_new_batch_reuses_the_last_batchs_fixed_buffers(tmp_path, monkeypatch):
    """Graphs are recorded for buffers: a batch that starts after the last one finished decodes in
    the same buffers (and the same graphs) when it fits, and regrows them when it does not."""
    from plasmid_torchgen.graphs import DecodeGraphs

    model = _model(tmp_path / "qwen2", "qwen2")
    seen = []
    run_graphs = DecodeGraphs.__call__
    monkeypatch.setattr(DecodeGraphs, "__call__", lambda self, tokens, positions, mask, cache: seen.append(
        (cache, _addresses(cache), cache.generation)) or run_graphs(self, tokens, positions, mask, cache))
    loop = asyncio.new_event_loop()
    try:
        decoder = Decoder(model, torch.Generator().manual_seed(0), graphs=True)
        for wave, count in enumerate((5, 3, 9)):          # 9 rows do not fit the 8 slots of the first batch
            seen.clear()
            _drive(decoder, {0: _requests(_prompts(count, seed=wave), loop, 10 * wave)})
            caches = {id(cache) for cache, _, _ in seen}
            assert len(caches) == 1
            if wave == 0:
                first_cache, first_addresses = seen[0][0], seen[0][1]
            assert seen[0][0] is first_cache
            assert (seen[0][1] == first_addresses) == (wave < 2) and (seen[0][2] == 0) == (wave < 2)
    finally:
        loop.close()
