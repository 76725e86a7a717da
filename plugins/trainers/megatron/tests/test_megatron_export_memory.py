"""Bounded host memory per rank while the megatron trainer saves a checkpoint and exports its
weights (the sync's trainer side), measured: four ranks over gloo (``memory_worker.py``), tensor x
pipeline parallel 2 x 2 on a dense model and pipeline x expert parallel 2 x 2 on a
mixture-of-experts one (megatron's local layers cannot combine tensor parallelism with experts on
the CPU: it needs sequence parallelism, i.e. TransformerEngine), each model tens of MB.

Every rank's peak RSS during the phase must stay within what it held before (the process and its
own shards: parameters, gradient buffers, Adam's moments) + ``bucket + GATHER_COPIES x largest
tensor`` (the bucket being handed on, the tensor read past it, :func:`plasmid_megatron.hf_export.buckets`,
and the gather's transient copies) + :data:`ALLOWANCE`. glibc is told to map every allocation over
64 KiB on its own, so that RSS counts live tensors. The earlier save, which collected every Hugging
Face tensor on every rank, grew by the whole model and more (pp2-ep2: 50-52 MiB for a 36 MiB
model; tp2-pp2: 55.6-56.6 MiB for 40 MiB) and fails this (the bound is 28.8 MiB).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from multiprocess import run_ranks
from safetensors import safe_open

from plasmid_torch.tiny import char_tokenizer, tiny_config

WORKER = Path(__file__).resolve().parent / "memory_worker.py"
BUCKET = 4_000_000
#: how many copies of one Hugging Face tensor a rank holds at once while exporting it on the CPU:
#: the gathered tensor-parallel pieces, the merged tensor and its CPU copy (on a GPU the first two
#: are device memory, and the host holds only the copy: 1)
GATHER_COPIES = 3
#: what a rank's RSS grows by beyond that: megatron's distributed-checkpoint save (its metadata and
#: the planner's bookkeeping; the writer is a forked process), gloo's buffers. Measured: peak growth
#: minus ``bucket + 3 x largest`` (12.8 MiB here) at most 3.8 MiB in a save and 1.9 MiB in a sync
#: (over the 8 ranks of both layouts); 16 MiB leaves room for a loaded machine and other allocators.
ALLOWANCE = 16 << 20
#: layout -> (architecture, layers, trainer options)
LAYOUTS = {
    "tp2-pp2": ("qwen2", 4, {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2}),
    "pp2-ep2": ("qwen3_moe", 6, {"pipeline_model_parallel_size": 2, "expert_model_parallel_size": 2}),
}


def build_model(directory: Path, arch: str, layers: int) -> Path:
    """A random ``arch`` model of tens of MB in float32: hidden 384, a 2048-row vocabulary (its
    largest tensors, the embedding and the output layer, are 3.1 MB each)."""
    import transformers

    config = tiny_config(2048, arch=arch, hidden_size=384, num_layers=layers, num_kv_heads=2,
                         tie_word_embeddings=False)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    char_tokenizer().save_pretrained(directory)
    return directory


def tensor_bytes(directory: Path) -> tuple[int, int]:
    """(total, largest) bytes of the model's tensors."""
    sizes = []
    for file in directory.glob("*.safetensors"):
        with safe_open(str(file), framework="pt") as reader:
            sizes += [reader.get_slice(name).get_shape() for name in reader.keys()]
    counts = [4 * int(torch.tensor(shape).prod()) if shape else 4 for shape in sizes]
    return sum(counts), max(counts)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_peak_host_memory_per_rank_is_own_shards_plus_a_bucket(layout, tmp_path, monkeypatch):
    arch, layers, options = LAYOUTS[layout]
    # glibc: every allocation over 64 KiB is its own mapping, returned to the system when freed (no
    # dynamic threshold), so that the peak RSS counts the tensors alive at once, not heap reuse
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    model = build_model(tmp_path / "model", arch, layers)
    total, largest = tensor_bytes(model)
    assert total > 30e6 and BUCKET < total / 4
    run_ranks(WORKER, {"model": str(model), "out": str(tmp_path / "out"), "bucket": BUCKET, "options": options}, 4)
    bound = BUCKET + GATHER_COPIES * largest + ALLOWANCE
    ranks = [json.loads((tmp_path / "out" / f"rank_{rank}.json").read_text()) for rank in range(4)]
    report = {phase: [round(r[phase]["growth"] / 2**20, 1) for r in ranks] for phase in ("save", "sync")}
    print(f"{layout}: model {total / 2**20:.1f} MiB, bucket {BUCKET / 2**20:.1f} MiB, largest tensor "
          f"{largest / 2**20:.1f} MiB, own shards {[round(r['own'] / 2**20, 1) for r in ranks]} MiB, "
          f"RSS growth per rank (MiB): {report}, bound {bound / 2**20:.1f} MiB")
    for rank, result in enumerate(ranks):
        assert result["sync"]["largest_bucket"] <= max(BUCKET, largest), rank
        for phase in ("save", "sync"):
            assert result[phase]["growth"] <= bound, (layout, rank, phase, report)
    directory = tmp_path / "out" / "ckpt" / "model"
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == total and len(set(index["weight_map"].values())) >= total // BUCKET
