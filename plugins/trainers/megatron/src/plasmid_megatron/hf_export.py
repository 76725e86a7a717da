"""Hugging Face weights out of a trainer, in bounded host memory: buckets, and sharded safetensors.

Both weight syncs (:meth:`plasmid_megatron.trainer.MegatronTrainer.export_weights`) and checkpoints
(:func:`plasmid_megatron.checkpoint.write`) consume the collective export
(:func:`plasmid_megatron.model.export_hf_weights`: one full Hugging Face tensor at a time, on every
rank) through this module, so no rank ever holds a full copy of the model:

- :func:`buckets` groups the stream into lists of at most ``bucket_bytes`` bytes (a larger tensor
  alone), taking the next tensor from the stream only once the previous bucket has been handed on;
- :func:`write_sharded` writes the stream as Hugging Face's sharded safetensors layout
  (``model-00001-of-0000N.safetensors`` + ``model.safetensors.index.json`` with ``metadata.total_size``
  and ``weight_map``), one bucket per file, on the writer rank; every other rank drains the stream
  (it takes part in its collectives) and drops each tensor at once. A model that fits in one
  bucket is one ``model.safetensors`` without an index, as ``save_pretrained`` writes it.

Host memory beyond a rank's own shards: the writer one bucket (plus the tensor that closes it),
every other rank one tensor (the largest Hugging Face tensor, typically the embedding).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from plasmid_torch.disk_sync import INDEX_FILE, SINGLE_FILE, name_shards, shard_name
from plasmid_torch.tensors import bucketed, tensor_bytes

__all__ = ["INDEX_FILE", "SINGLE_FILE", "buckets", "nbytes", "shard_name", "write_sharded"]

NamedTensor = tuple[str, torch.Tensor]


def nbytes(tensor: torch.Tensor) -> int:
    """Bytes of ``tensor``'s data."""
    return tensor_bytes(tensor)


def buckets(tensors: Iterable[NamedTensor], bucket_bytes: int) -> Iterator[list[NamedTensor]]:
    """``tensors`` in consecutive buckets of at most ``bucket_bytes`` bytes, lazily
    (:func:`plasmid_torch.tensors.bucketed`: read one tensor past the bucket being yielded)."""
    return bucketed(tensors, bucket_bytes)


def write_sharded(tensors: Iterable[NamedTensor], directory: str | Path, shard_bytes: int, *,
                  writer: bool) -> BaseException | None:
    """Write ``tensors`` into ``directory`` as sharded safetensors of at most ``shard_bytes`` each
    (one bucket of :func:`buckets` per file) with ``model.safetensors.index.json``, or as one
    ``model.safetensors`` when they fit in one shard. Only where ``writer`` is true; elsewhere the
    stream is drained and nothing is written.

    The stream is always read to its end (it is a collective): a failure to write (a full disk)
    stops the writing, not the reading, and is returned (``None`` when all went well) so the
    caller can tell every rank before raising. Nothing but the shard files and the index is
    written; files of an earlier failed attempt with these names are overwritten."""
    from safetensors.torch import save_file

    if shard_bytes <= 0:
        raise ValueError(f"shard_bytes must be > 0, got {shard_bytes} (--update-weight-buffer-size)")
    if not writer:
        for _ in tensors:
            pass
        return None
    directory = Path(directory)
    failure: BaseException | None = None
    written: list[tuple[Path, list[str]]] = []
    total = 0
    for bucket in buckets(tensors, shard_bytes):
        if failure is None:
            part = directory / f"model-{len(written) + 1:05d}.safetensors.partial"
            try:
                save_file(dict(bucket), str(part), metadata={"format": "pt"})
            except Exception as exc:  # noqa: BLE001 - keep reading the collective stream, report after it
                failure = exc
            else:
                written.append((part, [name for name, _ in bucket]))
                total += sum(nbytes(tensor) for _, tensor in bucket)
        del bucket
    if failure is not None:
        return failure
    try:
        name_shards(directory, written, total)
    except Exception as exc:  # noqa: BLE001 - the caller reports it on every rank
        return exc
    return None
