"""How the loop (:func:`plasmid.loop.train`) uses CPython's cyclic garbage collector: never over
the objects that exist when it starts.

The loop makes and drops thousands of small objects a step (samples, their token lists, the
metrics), which trigger a young collection every few hundred microseconds of work and a full one
every 15-20 steps; a full one walks everything start-up made (torch, transformers, the plugins:
some 400 thousand objects, ~150 ms on the quickstart). :func:`startup_objects_frozen` collects
once, freezes what exists (:func:`gc.freeze`: a generation no collection visits) and raises the
young threshold (:data:`LOOP_THRESHOLDS`) for the loop's duration: a step's garbage then mostly
dies by reference counting before a collection runs (on the quickstart the collector's time in
the loop went from ~0.9 ms a step to ~0). Cycles are still collected, only less often; the full
collection before the freeze frees everything start-up left in cycles, so nothing is frozen that
is already garbage. Nothing a run computes depends on when garbage is collected.

How ``plasmid train`` treats the collector while it starts is the application's business.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

#: ``gc.set_threshold`` while the loop runs (the start-up objects are frozen then)
LOOP_THRESHOLDS = (20_000, 10, 10)


@contextlib.contextmanager
def startup_objects_frozen() -> Iterator[None]:
    """Keep the collector off the objects that exist on entry (see the module docstring).

    On entry: one full collection, then :func:`gc.freeze` and :data:`LOOP_THRESHOLDS`. A full
    collection inside then walks only what the loop made. On exit, by an error too: the previous
    thresholds and :func:`gc.unfreeze` (the frozen objects become collectable again).
    """
    gc.collect()
    gc.freeze()
    try:
        with thresholds(LOOP_THRESHOLDS):
            yield
    finally:
        gc.unfreeze()


@contextlib.contextmanager
def thresholds(values: tuple[int, int, int]) -> Iterator[None]:
    """``gc.set_threshold(*values)`` inside; the thresholds before it after, by an error too."""
    before = gc.get_threshold()
    gc.set_threshold(*values)
    try:
        yield
    finally:
        gc.set_threshold(*before)
