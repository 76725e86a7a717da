"""What a restarted server needs to serve its engine's current weights again.

A restarted server starts from ``--model``; the journal replays, in order, what was loaded since:
the last version directory loaded from disk (only its path is kept), the tensor payloads loaded
after it (kept as sent, text; a newer payload with the same tensor names replaces an older one,
so a full sync costs one copy of the model in this process's memory), and the adapter served on
top of them (a LoRA adapter's served name and directory), if any. Weights that never pass through
the engine's process (a distributed group, CUDA IPC handles) make the journal record that it
cannot restore them, and a restarted server is out of service, until payloads or a directory
covering every tensor of the model have been loaded again.

With restarts off (``enabled`` false) nothing is kept. The journal is shared with the health
monitor's thread, hence the lock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass
class JournalSnapshot:
    """What to replay: ``disk`` (a directory or ``None``), then ``payloads`` ``[(names, payload)]``,
    then ``adapter`` (``(served name, directory)`` or ``None``); ``lost`` says why the weights
    cannot be restored (``None`` when they can)."""

    disk: str | None
    payloads: list[tuple[tuple[str, ...], str]]
    adapter: tuple[str, str] | None
    lost: str | None


@dataclass
class WeightJournal:
    """See the module docstring. ``enabled`` false: record nothing (restarts are off)."""

    enabled: bool = True
    #: every tensor name of the served model (payloads covering them all make it restorable again)
    all_names: frozenset[str] = frozenset()
    _disk: str | None = None
    _payloads: OrderedDict[tuple[str, ...], str] = field(default_factory=OrderedDict)
    _adapter: tuple[str, str] | None = None
    _lost: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def loaded_payload(self, names: list[str], payload: str) -> None:
        """A payload holding tensors ``names`` was loaded into every server."""
        if not self.enabled:
            return
        key = tuple(names)
        with self._lock:
            self._payloads.pop(key, None)
            self._payloads[key] = payload
            if self._lost is not None and self.all_names <= {n for k in self._payloads for n in k}:
                self._lost = None

    def loaded_directory(self, directory: str) -> None:
        """A full version was loaded from ``directory``: it replaces everything before it."""
        with self._lock:
            self._disk, self._lost, self._adapter = directory, None, None
            self._payloads.clear()

    def served_adapter(self, adapter: tuple[str, str] | None) -> None:
        """From now on ``adapter`` (``(served name, directory)``) is served on top; ``None``: none."""
        with self._lock:
            self._adapter = adapter

    def lost_track(self, reason: str) -> None:
        """Weights were loaded that the journal cannot replay (``reason`` says how they came)."""
        with self._lock:
            self._lost, self._disk, self._adapter = reason, None, None
            self._payloads.clear()

    def snapshot(self) -> JournalSnapshot:
        with self._lock:
            return JournalSnapshot(self._disk, list(self._payloads.items()), self._adapter, self._lost)
