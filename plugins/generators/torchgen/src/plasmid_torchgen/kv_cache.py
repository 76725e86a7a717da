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

The lean decoding step (:mod:`.lean`) keeps its keys and values in a :class:`StaticKV` instead:
the same ``[rows, kv_heads, columns, head_dim]`` layout inside buffers preallocated with room for
more columns, written in place one column per step. The functions below take either kind.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicCache, DynamicLayer

#: most columns :meth:`StaticKV.reserve` is asked for at a time (a longer response grows it again).
RESERVE_COLUMNS = 256


class StaticKV:
    """Keys and values of a batch's rows in preallocated buffers (what :mod:`.lean` decodes with).

    :ivar keys: per layer ``[rows, kv_heads, capacity, head_dim]``; columns ``[:columns]`` hold
        cached positions (left padding included), the rest is room not yet written.
    :ivar values: per layer, laid out as ``keys``.
    :ivar columns: the cached columns (the same for every row: the batch is left-padded).
    """

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], columns: int) -> None:
        self.keys = keys
        self.values = values
        self.columns = columns

    @classmethod
    def from_dynamic(cls, cache: DynamicCache, room: int) -> StaticKV:
        """A copy of ``cache`` (every layer a ``DynamicLayer`` holding the same columns) with
        ``room`` unwritten columns after its own."""
        columns = cache.get_seq_length()
        return cls([_with_room(layer.keys, columns, room) for layer in cache.layers],
                   [_with_room(layer.values, columns, room) for layer in cache.layers], columns)

    @property
    def capacity(self) -> int:
        """Columns the buffers hold, written or not."""
        return self.keys[0].shape[2]

    def get_seq_length(self) -> int:
        return self.columns

    def reserve(self, room: int) -> None:
        """Make room for at least ``room`` more columns (reallocating when there is less)."""
        if self.capacity - self.columns < room:
            self.keys = [_with_room(k, self.columns, room) for k in self.keys]
            self.values = [_with_room(v, self.columns, room) for v in self.values]

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (``[kept]`` int64 indices, in the new order)."""
        rows = rows.to(self.keys[0].device)
        self.keys = [k[rows] for k in self.keys]
        self.values = [v[rows] for v in self.values]

    def drop_leading_columns(self, count: int) -> None:
        """Remove the first ``count`` columns (views: the room after the columns is kept)."""
        self.keys = [k[:, :, count:] for k in self.keys]
        self.values = [v[:, :, count:] for v in self.values]
        self.columns -= count

    def join(self, other: StaticKV) -> None:
        """Append ``other``'s rows, left-padding the one with fewer columns with zeros; the room
        after the columns is the larger of the two."""
        columns = max(self.columns, other.columns)
        room = max(self.capacity - self.columns, other.capacity - other.columns)
        self.keys = [_joined(mine, self.columns, theirs, other.columns, columns, room)
                     for mine, theirs in zip(self.keys, other.keys, strict=True)]
        self.values = [_joined(mine, self.columns, theirs, other.columns, columns, room)
                       for mine, theirs in zip(self.values, other.values, strict=True)]
        self.columns = columns


def _with_room(states: torch.Tensor, columns: int, room: int) -> torch.Tensor:
    """A new buffer with ``states[:, :, :columns]`` first and ``room`` unwritten columns after."""
    rows, heads, _, dim = states.shape
    buffer = states.new_empty((rows, heads, columns + room, dim))
    buffer[:, :, :columns] = states[:, :, :columns]
    return buffer


def _joined(first: torch.Tensor, first_columns: int, second: torch.Tensor, second_columns: int,
            columns: int, room: int) -> torch.Tensor:
    rows, heads, _, dim = first.shape
    buffer = first.new_zeros((rows + second.shape[0], heads, columns + room, dim))
    buffer[:rows, :, columns - first_columns:columns] = first[:, :, :first_columns]
    buffer[rows:, :, columns - second_columns:columns] = second[:, :, :second_columns]
    return buffer


def new_cache(model_config) -> DynamicCache:
    """An empty cache laid out for ``model_config`` (the model's ``PretrainedConfig``)."""
    return DynamicCache(config=model_config)


def supports_surgery(cache: DynamicCache | StaticKV) -> bool:
    """Whether :func:`join_rows` and :func:`drop_leading_columns` may be used on ``cache``."""
    if isinstance(cache, StaticKV):
        return True
    return isinstance(cache, DynamicCache) and all(type(layer) is DynamicLayer for layer in cache.layers)


def select_rows(cache: DynamicCache | StaticKV, rows: torch.Tensor) -> None:
    """Keep only ``rows`` (``[kept]`` int64 indices, in the new order), in place."""
    if isinstance(cache, StaticKV):
        cache.select_rows(rows)
        return
    layers = [layer for layer in cache.layers if getattr(layer, "keys", None) is not None]
    cache.batch_select_indices(rows.to(layers[0].keys.device) if layers else rows)


def drop_leading_columns(cache: DynamicCache | StaticKV, count: int) -> None:
    """Remove the first ``count`` columns of every row, in place (they must be padding)."""
    if isinstance(cache, StaticKV):
        cache.drop_leading_columns(count)
        return
    for layer in cache.layers:
        layer.keys = layer.keys[:, :, count:]
        layer.values = layer.values[:, :, count:]


def join_rows(first: DynamicCache | StaticKV, second: DynamicCache | StaticKV) -> None:
    """Append the rows of ``second`` to ``first``, in place, left-padding the shorter with zeros
    (both caches of the same kind).

    The caller pads the two attention masks the same way (see :func:`padding_to_join`).
    """
    if isinstance(first, StaticKV) and isinstance(second, StaticKV):
        first.join(second)
        return
    first_pad, second_pad = padding_to_join(first, second)
    for mine, theirs in zip(first.layers, second.layers, strict=True):
        mine.keys = torch.cat([_pad_left(mine.keys, first_pad), _pad_left(theirs.keys, second_pad)])
        mine.values = torch.cat([_pad_left(mine.values, first_pad), _pad_left(theirs.values, second_pad)])


def padding_to_join(first: DynamicCache | StaticKV, second: DynamicCache | StaticKV) -> tuple[int, int]:
    """Columns of left padding that ``first`` and ``second`` need to reach the same length."""
    first_columns, second_columns = first.get_seq_length(), second.get_seq_length()
    width = max(first_columns, second_columns)
    return width - first_columns, width - second_columns


def _pad_left(states: torch.Tensor, columns: int) -> torch.Tensor:
    return F.pad(states, (0, 0, columns, 0)) if columns else states
