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


class FixedKV(StaticKV):
    """A :class:`StaticKV` whose buffers keep their addresses while rows leave and join: what a
    captured CUDA graph replays against (:mod:`.graphs`).

    Each layer's keys and values live in a buffer of ``slots`` rows and :attr:`capacity` columns;
    the batch's rows are its first ``rows`` (:attr:`keys` / :attr:`values` are views of them, so
    :class:`~plasmid_torchgen.lean.LeanStep` runs on them unchanged). Rows leave by moving the kept
    ones to the front and join behind them; columns are shifted in place. The buffers start zeroed
    and only ever receive finite values: a graph attends over every column, the masked ones with
    weight 0, and ``0 * NaN`` would be NaN. Only growing past ``slots`` rows or the capacity
    reallocates; :attr:`generation` counts reallocations (graphs captured before one are stale).
    """

    def __init__(self, key_buffers: list[torch.Tensor], value_buffers: list[torch.Tensor], rows: int,
                 columns: int) -> None:
        self.key_buffers, self.value_buffers = key_buffers, value_buffers
        self.generation = 0
        super().__init__([], [], columns)
        self._set_rows(rows)

    @classmethod
    def of(cls, cache: StaticKV, room: int = 0) -> FixedKV:
        """A copy of ``cache`` in buffers of :func:`slots_for` its rows, with at least ``room``
        unwritten columns (a multiple of :data:`COLUMN_QUANTUM` in all)."""
        rows = cache.keys[0].shape[0]
        capacity = _quantum(max(cache.capacity, cache.columns + room))
        fixed = cls(_zeroed(cache.keys, slots_for(rows), capacity), _zeroed(cache.values, slots_for(rows), capacity),
                    rows, cache.columns)
        fixed._write(0, cache, cache.columns)
        return fixed

    def refill(self, cache: StaticKV) -> None:
        """Hold ``cache``'s rows instead of the current ones (a new batch in the same buffers, so
        graphs recorded for them stay valid), reallocating only when they do not fit."""
        rows = cache.keys[0].shape[0]
        room = cache.capacity - cache.columns
        if rows > self.slots or cache.columns + room > self.capacity:
            self._set_rows(0)
            self._reallocate(max(self.slots, slots_for(rows)), max(self.capacity, _quantum(cache.columns + room)))
        self.columns = cache.columns
        self._write(0, cache, cache.columns)
        self._set_rows(rows)

    @property
    def slots(self) -> int:
        """Rows the buffers hold (the batch's and free ones)."""
        return self.key_buffers[0].shape[0]

    @property
    def capacity(self) -> int:
        return self.key_buffers[0].shape[2]

    def reserve(self, room: int) -> None:
        if self.capacity - self.columns < room:
            self._reallocate(self.slots, _quantum(self.columns + room))

    def select_rows(self, rows: torch.Tensor) -> None:
        kept = len(rows)
        if kept > self.slots:
            self._reallocate(slots_for(kept), self.capacity)
        rows = rows.to(self.key_buffers[0].device)
        for buffer in (*self.key_buffers, *self.value_buffers):
            buffer[:kept] = buffer[rows]             # the gather is made first, then copied to the front
        self._set_rows(kept)

    def drop_leading_columns(self, count: int) -> None:
        rows, left = self.rows, self.columns - count
        for buffer in (*self.key_buffers, *self.value_buffers):
            buffer[:rows, :, :left] = buffer[:rows, :, count:self.columns].clone()
        self.columns = left

    def join(self, other: StaticKV) -> None:
        rows, joining = self.rows, other.keys[0].shape[0]
        columns = max(self.columns, other.columns)
        room = other.capacity - other.columns        # what the newcomers asked for (later growth: reserve)
        if rows + joining > self.slots or columns + room > self.capacity:
            self._reallocate(max(self.slots, slots_for(rows + joining)), max(self.capacity, _quantum(columns + room)))
        if columns > self.columns:                   # left-pad the batch's rows: shift them right
            shift = columns - self.columns
            for buffer in (*self.key_buffers, *self.value_buffers):
                buffer[:rows, :, shift:columns] = buffer[:rows, :, :self.columns].clone()
                buffer[:rows, :, :shift] = 0
            self.columns = columns
        self._write(rows, other, columns)
        self._set_rows(rows + joining)

    def _write(self, first_row: int, cache: StaticKV, columns: int) -> None:
        """Rows ``first_row..`` := ``cache``'s rows, left-padded with zeros to end at column ``columns``."""
        count, pad = cache.keys[0].shape[0], columns - cache.columns
        for buffers, states in ((self.key_buffers, cache.keys), (self.value_buffers, cache.values)):
            for buffer, state in zip(buffers, states, strict=True):
                buffer[first_row:first_row + count, :, :pad] = 0
                buffer[first_row:first_row + count, :, pad:columns] = state[:, :, :cache.columns]

    def _reallocate(self, slots: int, capacity: int) -> None:
        rows, columns = self.rows, self.columns
        self.key_buffers = _zeroed([b[:rows, :, :columns] for b in self.key_buffers], slots, capacity, copy=True)
        self.value_buffers = _zeroed([b[:rows, :, :columns] for b in self.value_buffers], slots, capacity, copy=True)
        self.generation += 1
        self._set_rows(rows)

    def _set_rows(self, rows: int) -> None:
        self.rows = rows
        self.keys = [buffer[:rows] for buffer in self.key_buffers]
        self.values = [buffer[:rows] for buffer in self.value_buffers]


#: :class:`FixedKV` capacities are multiples of this many columns (fewer reallocations, fewer graphs)
COLUMN_QUANTUM = 64


def slots_for(rows: int) -> int:
    """The power of two at or above ``rows``: the row buckets of :class:`FixedKV` and its graphs."""
    return 1 << max(rows - 1, 0).bit_length()


def _quantum(columns: int) -> int:
    return -(-columns // COLUMN_QUANTUM) * COLUMN_QUANTUM


def _zeroed(states: list[torch.Tensor], slots: int, capacity: int, copy: bool = False) -> list[torch.Tensor]:
    """Zeroed ``[slots, heads, capacity, dim]`` buffers like ``states`` (each state's own dtype and
    device); with ``copy`` holding ``states`` in their leading rows and columns."""
    buffers = []
    for state in states:
        rows, heads, columns, dim = state.shape
        buffer = state.new_zeros((slots, heads, capacity, dim))
        if copy:
            buffer[:rows, :, :columns] = state
        buffers.append(buffer)
    return buffers


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
