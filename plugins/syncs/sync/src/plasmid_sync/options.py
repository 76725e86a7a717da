"""The options of plasmid-sync's own syncs (``delta``, ``broadcast``); where ``disk`` and
``delta`` keep weights on disk is :class:`plasmid_torch.disk_sync.DiskSyncOptions`."""

from __future__ import annotations

from typing import Literal

from plasmid.options import Options, option


class SyncOptions(Options, group="sync", description="weight syncs of plasmid-sync (--weight-sync)"):
    delta_zstd_level: int = option(3, "zstd compression level of delta", min=1, max=22)
    broadcast_backend: Literal["auto", "gloo", "nccl"] = option(
        "auto", "torch.distributed backend of broadcast (auto: nccl when the trainer sees a GPU)")
    broadcast_timeout: float = option(600.0, "seconds a broadcast group waits for its members", gt=0)
    inprocess_share_weights: Literal["auto", "off"] = option(
        "auto", "inprocess: engines read the trainer's weights in place instead of holding a copy (one copy of the "
        "model in memory, nothing copied per sync) where trainer and engine support it and dtypes and devices agree; "
        "auto: with --schedule sync and --update-weights-interval 1 (the engines then never generate while weights "
        "change), off: copy at every sync")
