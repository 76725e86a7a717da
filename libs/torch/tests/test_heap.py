"""plasmid_torch.heap: the glibc mmap threshold is fixed where the C library is glibc (Linux, as in CI)."""

from __future__ import annotations

import sys

import pytest

from plasmid_torch import heap


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt is Linux-only")
def test_the_threshold_is_set_on_glibc():
    heap.map_large_blocks.cache_clear()
    assert heap.map_large_blocks(4 << 20) is True
    assert heap.map_large_blocks(4 << 20) is True           # cached: mallopt is called once per threshold
    assert heap.map_large_blocks.cache_info().hits == 1
