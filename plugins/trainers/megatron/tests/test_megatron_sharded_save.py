"""The megatron trainer's Hugging Face export in bounded memory: a checkpoint's ``model/`` is
Hugging Face's sharded safetensors layout (shards of at most --update-weight-buffer-size, an index)
that transformers loads and the trainer resumes from; a write failing mid-stream leaves the
previous checkpoint as it was. (Peak memory per rank: test_megatron_export_memory.py.)"""

from __future__ import annotations

import json

import plasmid_grpo.plugin
import plasmid_megatron.plugin
import pytest
import torch
from plasmid_megatron import hf_export

from plasmid import testing
from plasmid_torch.testing.contracts.trainer import exported, make_rollout_batch

VOCAB = 16
SHARD = 40_000          # bytes: the tiny model (~170 kB in float32) in several shards


def make_trainer(model_dir, tmp_path, **options):
    options = {"trainer": "megatron", "model": str(model_dir), "lr": 1e-3, "megatron_optimizer": "adam",
               "run_dir": tmp_path / "run", **options}
    config = testing.make_config(plasmid_megatron.plugin, plasmid_grpo.plugin, **options)
    loss = testing.build("loss", "grpo", plasmid_grpo.plugin, config=config)
    return testing.build("trainer", "megatron", plasmid_megatron.plugin, config=config, args=(loss,))


def test_the_export_is_sharded_with_an_index_and_loads(model_dir, tmp_path):
    import transformers

    trainer = make_trainer(model_dir, tmp_path, update_weight_buffer_size=SHARD)
    testing.run(trainer.train_step(make_rollout_batch(VOCAB)))
    testing.run(trainer.save(str(tmp_path / "ckpt")))
    directory = tmp_path / "ckpt" / "model"
    index = json.loads((directory / hf_export.INDEX_FILE).read_text())
    shards = sorted(path.name for path in directory.glob("*.safetensors"))
    assert len(shards) > 2 and shards == [hf_export.shard_name(i, len(shards)) for i in range(1, len(shards) + 1)]
    assert not (directory / hf_export.SINGLE_FILE).exists() and not list(directory.glob("*.partial"))
    weights = exported(trainer)
    assert sorted(index["weight_map"]) == sorted(weights) and set(index["weight_map"].values()) == set(shards)
    assert index["metadata"]["total_size"] == sum(value.nbytes for value in weights.values())
    from safetensors.torch import load_file
    for shard in shards:
        tensors = load_file(str(directory / shard))
        assert sum(hf_export.nbytes(t) for t in tensors.values()) <= SHARD or len(tensors) == 1, shard

    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    state = model.state_dict()
    for name, value in weights.items():
        assert torch.equal(state[name], torch.from_numpy(value)), name

    resumed = make_trainer(model_dir, tmp_path)            # another shard size: reading does not care
    testing.run(resumed.load(str(tmp_path / "ckpt")))
    assert resumed.steps == 1 and all((exported(resumed)[n] == v).all() for n, v in weights.items())
    restarted = make_trainer(directory, tmp_path)           # --model <checkpoint>/model: the sharded weights
    assert all((exported(restarted)[n] == v).all() for n, v in weights.items())


def test_a_write_failing_mid_stream_leaves_the_previous_checkpoint(model_dir, tmp_path, monkeypatch):
    import safetensors.torch

    trainer = make_trainer(model_dir, tmp_path, update_weight_buffer_size=SHARD)
    testing.run(trainer.save(str(tmp_path / "ckpt")))
    before = {p.relative_to(tmp_path): p.read_bytes() for p in (tmp_path / "ckpt").rglob("*") if p.is_file()}
    testing.run(trainer.train_step(make_rollout_batch(VOCAB)))
    real, calls = safetensors.torch.save_file, []

    def fails_on_the_third(tensors, filename, metadata=None):
        calls.append(filename)
        if len(calls) == 3:
            raise OSError("disk full")
        real(tensors, filename, metadata=metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", fails_on_the_third)
    with pytest.raises(OSError, match="disk full"):
        testing.run(trainer.save(str(tmp_path / "ckpt")))
    assert len(calls) == 3                                  # no shard written after the failure
    after = {p.relative_to(tmp_path): p.read_bytes() for p in (tmp_path / "ckpt").rglob("*") if p.is_file()}
    assert after == before


def test_buckets_are_lazy_and_bounded():
    taken = []

    def stream():
        for i, size in enumerate([3, 3, 5, 2, 9, 1]):
            taken.append(i)
            yield f"t{i}", torch.zeros(size, dtype=torch.uint8)

    seen = []
    for bucket in hf_export.buckets(stream(), 6):
        seen.append(([name for name, _ in bucket], len(taken)))
    # each bucket is handed on having read at most one tensor past it
    assert seen == [(["t0", "t1"], 3), (["t2"], 4), (["t3"], 5), (["t4"], 6), (["t5"], 6)]
    with pytest.raises(ValueError, match="update-weight-buffer-size"):
        next(hf_export.buckets(stream(), 0))


def test_the_host_memory_arithmetic_counts_the_published_sizes():
    """``python -m plasmid_megatron.host_memory`` (the README's table): parameter counts from the
    config shapes within 1% of the published totals (GLM-4.5's 355B includes its multi-token-prediction
    layer, not counted here), and the bound is bucket + largest tensor + allowance."""
    from plasmid_megatron import host_memory

    published = {"Qwen2.5-7B": 7.62e9, "Qwen3-30B-A3B": 30.5e9, "GLM-4.5-355B": 355e9}
    for name, shapes in host_memory.MODELS.items():
        figures = host_memory.per_rank(shapes)
        assert figures["parameters"] == pytest.approx(published[name], rel=0.01), name
        assert figures["before"] == 2 * figures["parameters"]
        assert figures["now"] == host_memory.DEFAULT_BUCKET + shapes.largest_tensor() + host_memory.ALLOWANCE
    assert host_memory.per_rank(host_memory.MODELS["Qwen3-30B-A3B"])["before"] * 8 == pytest.approx(489e9, rel=0.01)
    assert "| Qwen3-30B-A3B | 30.5 B | 0.62 GB |" in host_memory.table()
