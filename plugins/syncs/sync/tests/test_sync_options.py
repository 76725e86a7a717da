"""plasmid-sync's options are declared once, typed: a bad value fails at configuration time in
one line naming the flag, and a configuration that does not set them reads the declared defaults.
Where weights go on disk is the library's DiskSyncOptions, read alike by disk and delta."""

from __future__ import annotations

from pathlib import Path

import plasmid_sync.plugin
import pytest
from plasmid_sync.options import SyncOptions

from plasmid import testing
from plasmid.errors import UsageError
from plasmid_torch.disk_sync import DiskSyncOptions

pytest.importorskip("zstandard")


@pytest.mark.parametrize(("name", "value", "message"), [
    ("sync_keep_versions", 0, "--sync-keep-versions 0: must be >= 1"),
    ("delta_zstd_level", 0, "--delta-zstd-level 0: must be >= 1"),
    ("delta_zstd_level", 23, "--delta-zstd-level 23: must be <= 22"),
    ("broadcast_backend", "mpi", "--broadcast-backend 'mpi': choose one of auto, gloo, nccl"),
    ("broadcast_timeout", 0.0, "--broadcast-timeout 0.0: must be > 0"),
    ("sync_timeout", 0.0, "--sync-timeout 0.0: must be > 0"),
    ("verify_sync_every", -1, "--verify-sync-every -1: must be >= 0"),
    ("verify_sync_tensors", -1, "--verify-sync-tensors -1: must be >= 0"),
    ("verify_sync_bound", 0.0, "--verify-sync-bound 0.0: must be > 0"),
    ("sync_checksums", "maybe", "--sync-checksums 'maybe': choose one of on, off"),
])
def test_a_bad_value_is_a_one_line_usage_error_naming_the_flag(name, value, message):
    with pytest.raises(UsageError) as failure:
        testing.make_config(plasmid_sync.plugin, **{name: value})
    assert str(failure.value) == message


def test_typed_reads_give_the_declared_defaults():
    config = testing.make_config(plasmid_sync.plugin)
    assert SyncOptions.of(config) == SyncOptions(delta_zstd_level=3, broadcast_backend="auto", broadcast_timeout=600.0)
    assert DiskSyncOptions.of(config) == DiskSyncOptions(sync_dir=None, sync_keep_versions=2)


def test_the_disk_and_delta_syncs_keep_two_versions_under_the_run_dir_by_default(tmp_path):
    config = testing.make_config(plasmid_sync.plugin, run_dir=tmp_path / "run")
    disk = testing.build("weight_sync", "disk", plasmid_sync.plugin, config=config)
    delta = testing.build("weight_sync", "delta", plasmid_sync.plugin, config=config)
    assert disk.keep == delta.keep == 2, "the declared default, not a default restated where it is read"
    assert disk.root == tmp_path / "run" / "weights" and delta.root == tmp_path / "run" / "weights" / "delta"
    assert delta.level == 3


def test_sync_dir_is_a_path_read_by_disk_and_delta(tmp_path):
    config = testing.make_config(plasmid_sync.plugin, sync_dir=str(tmp_path / "shared"), sync_keep_versions=4,
                                 delta_zstd_level=9)
    assert DiskSyncOptions.of(config).sync_dir == Path(tmp_path / "shared")
    delta = testing.build("weight_sync", "delta", plasmid_sync.plugin, config=config)
    assert delta.root == tmp_path / "shared" / "delta" and delta.keep == 4 and delta.level == 9
