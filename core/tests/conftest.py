"""Fixtures shared by the kernel's tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture
def fsync_events(monkeypatch) -> list[str]:
    """``fsync <file name>`` for each fsync :mod:`plasmid.atomic` makes during the test, in order
    (a test may append its own events to the list to check what came before them)."""
    from plasmid import atomic

    events: list[str] = []
    real_fsync = atomic.os.fsync

    def recording_fsync(descriptor: int) -> None:
        events.append("fsync " + Path(os.readlink(f"/proc/self/fd/{descriptor}")).name)
        real_fsync(descriptor)

    monkeypatch.setattr(atomic.os, "fsync", recording_fsync)
    return events
