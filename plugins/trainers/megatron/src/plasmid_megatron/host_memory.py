"""Host memory per rank of the megatron trainer's Hugging Face export (checkpoint save, weight sync), by arithmetic.

The bound (:mod:`plasmid_megatron.hf_export`, measured by the plugin's
``tests/test_megatron_export_memory.py``): while a rank saves or exports, its resident memory stays
within what it held before (the process, and on the CPU its own shards) plus

    ``bucket + largest tensor + allowance``

(the bucket being handed on, the Hugging Face tensor read past it, and a fixed allowance for
communication buffers and bookkeeping) on a GPU, where the tensor-parallel gather and the merge
happen in device memory; on the CPU (the test) the gathered pieces and the merged tensor are host
memory too: ``bucket + 3 x largest tensor + allowance``. Before, every rank collected the whole model in host
memory at save time: ``total bytes`` per rank. On a GPU the shards live in device memory, so the
host figure per rank is the bound itself.

``python -m plasmid_megatron.host_memory [--bucket-bytes N] [--ranks-per-node R]`` prints both for
Qwen2.5-7B, Qwen3-30B-A3B and GLM-4.5 (355B), counted from their Hugging Face config shapes
(:data:`MODELS`; bf16; GLM-4.5's multi-token-prediction layer not counted).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

#: --update-weight-buffer-size's default: the bucket (and safetensors shard) size
DEFAULT_BUCKET = 512 * 1024**2
#: the allowance the test asserts (tests/test_megatron_export_memory.py ALLOWANCE)
ALLOWANCE = 16 * 1024**2


@dataclass(frozen=True)
class Shapes:
    """A decoder-only model's shapes, as in its Hugging Face ``config.json``."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int = 0                   # dense layers' intermediate size
    dense_layers: int = -1         # how many layers are dense (-1: all)
    experts: int = 0               # routed experts per MoE layer
    shared_experts: int = 0
    expert_ffn: int = 0
    tied: bool = False
    bytes_per_param: int = 2       # bf16

    def attention(self) -> int:
        q = self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        return self.hidden * (q + 2 * kv) + q * self.hidden + 2 * self.hidden

    def parameters(self) -> int:
        dense = self.layers if self.dense_layers < 0 else self.dense_layers
        moe = self.layers - dense
        per_dense = self.attention() + 3 * self.hidden * self.ffn
        per_moe = (self.attention() + (self.experts + self.shared_experts) * 3 * self.hidden * self.expert_ffn
                   + self.experts * self.hidden)
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return dense * per_dense + moe * per_moe + embeddings + self.hidden

    def largest_tensor(self) -> int:
        """Bytes of the largest Hugging Face tensor: the embedding (or a dense layer's MLP matrix)."""
        return self.bytes_per_param * max(self.vocab * self.hidden, self.hidden * self.ffn)


MODELS = {
    "Qwen2.5-7B": Shapes(vocab=152064, hidden=3584, layers=28, heads=28, kv_heads=4, head_dim=128, ffn=18944),
    "Qwen3-30B-A3B": Shapes(vocab=151936, hidden=2048, layers=48, heads=32, kv_heads=4, head_dim=128,
                            dense_layers=0, experts=128, expert_ffn=768),
    "GLM-4.5-355B": Shapes(vocab=151552, hidden=5120, layers=92, heads=96, kv_heads=8, head_dim=128, ffn=12288,
                           dense_layers=3, experts=160, shared_experts=1, expert_ffn=1536),
}


def per_rank(shapes: Shapes, bucket: int = DEFAULT_BUCKET, allowance: int = ALLOWANCE) -> dict[str, int]:
    """Host bytes per rank for the export of ``shapes``: ``before`` (the whole model) and ``now``
    (bucket + largest tensor + allowance)."""
    total = shapes.parameters() * shapes.bytes_per_param
    return {"parameters": shapes.parameters(), "before": total,
            "now": bucket + shapes.largest_tensor() + allowance, "largest": shapes.largest_tensor()}


def table(bucket: int = DEFAULT_BUCKET, ranks_per_node: int = 8) -> str:
    gb = 1e9
    lines = [f"bucket {bucket / 2**20:.0f} MiB, allowance {ALLOWANCE / 2**20:.0f} MiB, bf16, {ranks_per_node} ranks "
             f"per node", "", "| model | parameters | largest tensor | before: per rank / per node | "
             "now: per rank / per node |", "|---|---|---|---|---|"]
    for name, shapes in MODELS.items():
        figures = per_rank(shapes, bucket)
        lines.append(f"| {name} | {figures['parameters'] / 1e9:.1f} B | {figures['largest'] / gb:.2f} GB | "
                     f"{figures['before'] / gb:.0f} GB / {figures['before'] * ranks_per_node / gb:.0f} GB | "
                     f"{figures['now'] / gb:.2f} GB / {figures['now'] * ranks_per_node / gb:.1f} GB |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--bucket-bytes", type=int, default=DEFAULT_BUCKET)
    parser.add_argument("--ranks-per-node", type=int, default=8)
    args = parser.parse_args(argv)
    print(table(args.bucket_bytes, args.ranks_per_node))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
