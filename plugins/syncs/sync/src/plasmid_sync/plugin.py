"""Hook implementations of plasmid-sync (each sync's module is imported only when chosen)."""

from __future__ import annotations

from plasmid import hookimpl
from plasmid.config import OptionParser
from plasmid_sync.options import SyncOptions
from plasmid_torch.disk_sync import DiskSyncOptions
from plasmid_torch.sync_guard import SyncGuardOptions


@hookimpl
def plasmid_addoption(parser: OptionParser) -> None:
    parser.add_options(SyncOptions)
    parser.add_options(DiskSyncOptions)
    parser.add_options(SyncGuardOptions)


@hookimpl
def plasmid_weight_syncs(register):
    register("inprocess", "plasmid_sync.inprocess:InProcessSync", default=True)
    register("objectstore", "plasmid_sync.objectstore:ObjectStoreSync")
    register("broadcast", "plasmid_sync.broadcast:BroadcastSync")
    register("disk", "plasmid_torch.disk_sync:DiskSync")
    register("delta", "plasmid_sync.delta:DeltaSync")
