"""CUDA graphs of the lean decoding step (``--torchgen-cuda-graphs``).

On a GPU a decoding step of a small model is bound by launching kernels, not by computing them:
the lean step of a 24-layer model launches several hundred. A CUDA graph records one step's
kernels once and replays them with one launch. A graph replays fixed addresses and shapes, so:

- the batch's keys and values live in a :class:`~plasmid_torchgen.kv_cache.FixedKV`, whose
  buffers keep their addresses while rows leave and join;
- the step is :meth:`~plasmid_torchgen.lean.LeanStep.fixed_shape` (the new column written at an
  index held in a device tensor, attention over the whole capacity with a mask);
- its inputs are copied into static buffers first; rows are padded up to the next power of two
  (one graph per such row count), the padding rows attending to one column and writing only into
  the buffers' free rows.

A row count's first step runs eagerly (that step's answer; it also warms the kernels up) and is
then captured, into one memory pool shared by every row count; later steps of that row count
replay. Graphs are dropped when the cache reallocates (more rows or columns than its buffers hold,
:attr:`FixedKV.generation`) or another cache comes: the next steps capture again. Sampling stays
outside the graph (each row's generator draws as it does without graphs).

``capture=False`` runs the same path eagerly, without recording: what the CPU tests check (graphs
themselves need CUDA; ``benchmarks/gpu_check.py`` runs them on a GPU).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from plasmid_torchgen.kv_cache import FixedKV, slots_for
from plasmid_torchgen.lean import LeanStep


@dataclass
class _StaticInputs:
    """The step's inputs at fixed addresses, for every row of the cache's buffers."""

    tokens: torch.Tensor        # [slots, 1] int64
    positions: torch.Tensor     # [slots, 1] int64
    mask: torch.Tensor          # [slots, 1, 1, capacity] bool
    column: torch.Tensor        # [1] int64


class DecodeGraphs:
    """Runs :class:`LeanStep` decoding steps through captured CUDA graphs (see the module docs).

    Called by :class:`plasmid_torchgen.decoder.Decoder` on the engine's worker thread, under
    ``torch.inference_mode`` and the placement's autocast, in place of the lean step.

    :param lean: the step to capture (it references the served weights, which are updated in
        place, so graphs stay valid across weight syncs).
    :param capture: record and replay graphs (CUDA); ``False`` runs the fixed-shape step eagerly.
    """

    def __init__(self, lean: LeanStep, capture: bool = True) -> None:
        self.lean = lean
        self.capture = capture
        #: graphs recorded and replayed since the engine started (counters for stats and tests)
        self.captures = 0
        self.replays = 0
        self._graphs: dict[int, tuple[Any, torch.Tensor]] = {}
        self._bound: tuple[Any, ...] = ()
        self._inputs: _StaticInputs | None = None
        self._pool: Any = None

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, attention_mask: torch.Tensor,
                 cache: FixedKV) -> torch.Tensor:
        """:meth:`LeanStep.__call__`'s contract (the same arguments, on the model's device; one
        column appended to ``cache``) over a :class:`FixedKV`: ``[rows, vocab]`` logits."""
        rows, columns = cache.rows, cache.columns
        bucket = slots_for(rows)
        inputs = self._bind(cache, tokens.device)
        inputs.tokens[:rows].copy_(tokens)
        inputs.positions[:rows].copy_(positions)
        inputs.tokens[rows:bucket] = 0
        inputs.positions[rows:bucket] = 0
        inputs.mask[:bucket] = False
        inputs.mask[:rows, 0, 0, :columns + 1] = attention_mask.bool()
        inputs.mask[rows:bucket, 0, 0, 0] = True         # padding rows: one (finite) column each
        inputs.column.fill_(columns)
        arguments = (inputs.tokens[:bucket], inputs.positions[:bucket], inputs.mask[:bucket], inputs.column,
                     [buffer[:bucket] for buffer in cache.key_buffers],
                     [buffer[:bucket] for buffer in cache.value_buffers])
        graph = self._graphs.get(bucket)
        if graph is not None:
            graph[0].replay()
            self.replays += 1
            logits = graph[1]
        else:
            logits = self.lean.fixed_shape(*arguments)    # this step's answer; warms the kernels up
            if self.capture:
                self._graphs[bucket] = self._record(arguments)
        cache.columns = columns + 1
        return logits[:rows]

    def _record(self, arguments: tuple[Any, ...]) -> tuple[Any, torch.Tensor]:
        """A graph of :meth:`LeanStep.fixed_shape` on ``arguments`` and its output tensor (nothing
        runs while recording: the eager step before it wrote this step's column)."""
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        # Autocast's cache of cast weights would be freed after recording while the graph still
        # reads it: record with the cache off (the casts become kernels of the graph). Only this
        # thread's CUDA calls are checked while recording (others, if any, do not break it).
        autocast = torch.autocast("cuda", dtype=torch.get_autocast_dtype("cuda"),
                                  enabled=torch.is_autocast_enabled("cuda"), cache_enabled=False)
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"), autocast:
            output = self.lean.fixed_shape(*arguments)
        self.captures += 1
        return graph, output

    def forget(self) -> None:
        """Drop every recorded graph: the served weights moved to other storage (a trainer's tensors
        shared in place of the engine's, :meth:`WeightTable.share`), and replaying a graph would read
        the old storage. The next steps record again."""
        self._graphs.clear()

    def _bind(self, cache: FixedKV, device: torch.device) -> _StaticInputs:
        """Static inputs for ``cache``'s buffers; graphs recorded for other buffers (or another
        rotary table) are dropped. The buffers are referenced here, so their memory is not reused
        while graphs that point at it exist."""
        bound = (*cache.key_buffers, *cache.value_buffers, self.lean._cos, self.lean._sin)
        if self._inputs is not None and len(bound) == len(self._bound) and all(
                mine is theirs for mine, theirs in zip(bound, self._bound, strict=True)):
            return self._inputs
        self._graphs.clear()
        slots, capacity = cache.slots, cache.capacity
        self._inputs = _StaticInputs(
            tokens=torch.zeros((slots, 1), dtype=torch.int64, device=device),
            positions=torch.zeros((slots, 1), dtype=torch.int64, device=device),
            mask=torch.zeros((slots, 1, 1, capacity), dtype=torch.bool, device=device),
            column=torch.zeros(1, dtype=torch.int64, device=device))
        # the rotary table must cover the capacity before anything is recorded (a rebuilt table
        # would leave recorded graphs reading the old one; it is part of ``bound``)
        self.lean._rotary(self._inputs.positions[:1], capacity, self._dtype())
        self._bound = (*cache.key_buffers, *cache.value_buffers, self.lean._cos, self.lean._sin)
        self._pool = torch.cuda.graph_pool_handle() if self.capture else None
        return self._inputs

    def _dtype(self) -> torch.dtype:
        """The dtype of the step's hidden states: the embedding's (autocast does not change it)."""
        return self.lean.model.model.embed_tokens.weight.dtype
