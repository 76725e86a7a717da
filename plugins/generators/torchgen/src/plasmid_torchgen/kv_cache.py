"""Row and column surgery on a Hugging Face ``DynamicCache`` (what continuous batching needs).

Each layer of the cache holds ``keys`` and ``values`` of shape ``[rows, kv_heads, columns,
head_dim]``; column ``c`` of every row is one cached position, and the batch's 2-D attention mask
(``[rows, columns]``) says which columns are real tokens (1) and which are left padding (0).
Rows are dropped when their request finishes, two batches are joined by left-padding the shorter
one, and columns that are padding in every row are cut off.

Joining and cutting touch the layers' tensors, so they are done only for caches whose every
layer is a plain ``DynamicLayer`` (full attention: what Qwen2 and Llama use); see
:func:`supports_surgery`. Other caches (sliding windows, linear attention) still decode, without
new requests joining a running batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicCache, DynamicLayer


def new_cache(model_config) -> DynamicCache:
    """An empty cache laid out for ``model_config`` (the model's ``PretrainedConfig``)."""
    return DynamicCache(config=model_config)


def supports_surgery(cache: DynamicCache) -> bool:
    """Whether :func:`join_rows` and :func:`drop_leading_columns` may be used on ``cache``."""
    return isinstance(cache, DynamicCache) and all(type(layer) is DynamicLayer for layer in cache.layers)


def select_rows(cache: DynamicCache, rows: torch.Tensor) -> None:
    """Keep only ``rows`` (``[kept]`` int64 indices, in the new order), in place."""
    layers = [layer for layer in cache.layers if getattr(layer, "keys", None) is not None]
    cache.batch_select_indices(rows.to(layers[0].keys.device) if layers else rows)


def drop_leading_columns(cache: DynamicCache, count: int) -> None:
    """Remove the first ``count`` columns of every row, in place (they must be padding)."""
    for layer in cache.layers:
        layer.keys = layer.keys[:, :, count:]
        layer.values = layer.values[:, :, count:]


def join_rows(first: DynamicCache, second: DynamicCache) -> None:
    """Append the rows of ``second`` to ``first``, in place, left-padding the shorter with zeros.

    The caller pads the two attention masks the same way (see :func:`padding_to_join`).
    """
    first_pad, second_pad = padding_to_join(first, second)
    for mine, theirs in zip(first.layers, second.layers, strict=True):
        mine.keys = torch.cat([_pad_left(mine.keys, first_pad), _pad_left(theirs.keys, second_pad)])
        mine.values = torch.cat([_pad_left(mine.values, first_pad), _pad_left(theirs.values, second_pad)])


def padding_to_join(first: DynamicCache, second: DynamicCache) -> tuple[int, int]:
    """Columns of left padding that ``first`` and ``second`` need to reach the same length."""
    first_columns, second_columns = first.get_seq_length(), second.get_seq_length()
    width = max(first_columns, second_columns)
    return width - first_columns, width - second_columns


def _pad_left(states: torch.Tensor, columns: int) -> torch.Tensor:
    return F.pad(states, (0, 0, columns, 0)) if columns else states
