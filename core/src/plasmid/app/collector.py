"""How ``plasmid train`` uses CPython's cyclic garbage collector while it starts: seldom.

By default a young-generation collection runs every 700 net allocations of container objects and
every tenth one also collects the middle generation; each walks the objects of the generations it
collects. Start-up imports torch, transformers and the plugins (some 400 thousand objects that all
live on), so the default collector walks the same surviving objects over and over: about 0.5 s of
the quickstart's 3.3 s start-up. :func:`quiet_start_up` raises the thresholds
(:data:`START_UP_THRESHOLDS`: young collections only) for the whole of ``plasmid train``: 0.1 s.
It spans the loop too, because putting the default thresholds back before the loop's freeze
(:func:`plasmid.loop_gc.startup_objects_frozen`, which nests inside it) would set off one more
collection of everything start-up made right there (~150 ms). Cycles are still collected, only
less often; the previous thresholds come back when it ends, by an error too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from plasmid.loop_gc import LOOP_THRESHOLDS, thresholds

#: ``gc.set_threshold`` while a run starts (imports, building the providers): young collections only
START_UP_THRESHOLDS = (50_000, 1_000, 1_000)


@contextlib.contextmanager
def quiet_start_up() -> Iterator[None]:
    """Collect seldom (:data:`START_UP_THRESHOLDS`) inside; the previous thresholds after."""
    with thresholds(START_UP_THRESHOLDS):
        yield


__all__ = ["LOOP_THRESHOLDS", "START_UP_THRESHOLDS", "quiet_start_up"]
