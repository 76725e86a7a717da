"""How a training process uses CPython's cyclic garbage collector: seldom while it starts, and never
over the start-up objects while the loop runs. Nothing a run computes depends on when garbage is
collected; what changes is how much time the collector takes.

By default a young-generation collection runs every 700 net allocations of container objects and
every tenth one also collects the middle generation; each walks the objects of the generations it
collects. Both phases of a run allocate far more than that:

- **Start-up** imports torch, transformers and the plugins (some 400 thousand objects that all live
  on), so the default collector walks the same surviving objects over and over: about 0.5 s of the
  quickstart's 3.3 s start-up. :func:`quiet_start_up` raises the thresholds
  (:data:`START_UP_THRESHOLDS`: young collections only) for the whole of ``plasmid train``: 0.1 s.
  It spans the loop too, because putting the default thresholds back before the freeze would set
  off one more collection of everything start-up made right there (~150 ms).
- **The loop** makes and drops thousands of small objects a step (samples, their token lists, the
  metrics), which trigger a young collection every few hundred microseconds of work and a full one
  every 15-20 steps. :func:`startup_objects_frozen` collects once, freezes what exists
  (:func:`gc.freeze`: a generation no collection visits) and raises the young threshold
  (:data:`LOOP_THRESHOLDS`) for the loop's duration: a step's garbage then mostly dies by reference
  counting before a collection runs (on the quickstart the collector's time in the loop went from
  ~0.9 ms a step to ~0).

Cycles are still collected in both phases, only less often; the full collection before the freeze
frees everything start-up left in cycles (the recipe's model build leaves a model's modules and
tensors in some), so nothing is frozen that is already garbage. Both contexts put back what they
changed, by an error too, so a process that trains several times (tests) is left as it was.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

#: ``gc.set_threshold`` while a run starts (imports, building the providers): young collections only
START_UP_THRESHOLDS = (50_000, 1_000, 1_000)
#: ``gc.set_threshold`` while the loop runs (the start-up objects are frozen then)
LOOP_THRESHOLDS = (20_000, 10, 10)


@contextlib.contextmanager
def quiet_start_up() -> Iterator[None]:
    """Collect seldom (:data:`START_UP_THRESHOLDS`) inside; the previous thresholds after. The
    loop's :func:`startup_objects_frozen` nests inside it."""
    with _thresholds(START_UP_THRESHOLDS):
        yield


@contextlib.contextmanager
def startup_objects_frozen() -> Iterator[None]:
    """Keep the collector off the objects that exist when the loop starts (see the module docs).

    On entry: one full collection, then :func:`gc.freeze` and :data:`LOOP_THRESHOLDS`. A full
    collection inside then walks only what the loop made (~1 ms on the quickstart instead of
    ~150 ms). On exit: the previous thresholds and :func:`gc.unfreeze` (the frozen objects become
    collectable again).
    """
    gc.collect()
    gc.freeze()
    try:
        with _thresholds(LOOP_THRESHOLDS):
            yield
    finally:
        gc.unfreeze()


@contextlib.contextmanager
def _thresholds(values: tuple[int, int, int]) -> Iterator[None]:
    """``gc.set_threshold(*values)`` inside; the thresholds before it after, by an error too."""
    before = gc.get_threshold()
    gc.set_threshold(*values)
    try:
        yield
    finally:
        gc.set_threshold(*before)
