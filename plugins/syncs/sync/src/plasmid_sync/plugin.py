"""Hook implementations of plasmid-sync (each sync's module is imported only when chosen)."""

from __future__ import annotations

from plasmid import hookimpl
from plasmid.errors import UsageError


@hookimpl
def plasmid_addoption(parser):
    group = parser.getgroup("sync", "weight syncs of plasmid-sync (--weight-sync)")
    group.addoption("--sync-dir", default=None,
                    help="where disk and delta write weight versions (default: <run dir>/weights; on a "
                         "multi-node cluster, a shared file system)")
    group.addoption("--sync-keep-versions", type=int, default=2,
                    help="versions (disk) or updates (delta) kept on disk, newest first")
    group.addoption("--delta-zstd-level", type=int, default=3, help="zstd compression level of delta (1-22)")
    group.addoption("--broadcast-backend", default="auto", choices=["auto", "gloo", "nccl"],
                    help="torch.distributed backend of broadcast (auto: nccl when the trainer sees a GPU)")
    group.addoption("--broadcast-timeout", type=float, default=600.0,
                    help="seconds a broadcast group waits for its members")


@hookimpl
def plasmid_configure(config):
    option = config.option
    if getattr(option, "sync_keep_versions", 1) < 1:
        raise UsageError("--sync-keep-versions must be >= 1 (plugin sync)")
    if not 1 <= getattr(option, "delta_zstd_level", 3) <= 22:
        raise UsageError("--delta-zstd-level must be in 1..22 (plugin sync)")


@hookimpl
def plasmid_weight_syncs(register):
    register("inprocess", "plasmid_sync.inprocess:InProcessSync", default=True)
    register("objectstore", "plasmid_sync.objectstore:ObjectStoreSync")
    register("broadcast", "plasmid_sync.broadcast:BroadcastSync")
    register("disk", "plasmid_torch.disk_sync:DiskSync")
    register("delta", "plasmid_sync.delta:DeltaSync")
