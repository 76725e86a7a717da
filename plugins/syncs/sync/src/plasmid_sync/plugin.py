"""Hook implementations of plasmid-sync."""

from __future__ import annotations

from plasmid import hookimpl


@hookimpl
def plasmid_weight_syncs(register):
    register("inprocess", "plasmid_sync.inprocess:InProcessSync", default=True)
