"""Step snapshots: the trainer's state after its last finished step, held by the driver.

After each finished train step the driver asks the reader ranks (rank 0; every rank of a
collective trainer) for a snapshot: each runs its trainer's own ``save`` into a fresh directory
(:func:`snapshot_dir`, in ``/dev/shm`` when it has room), and rank 0 reads the files back
(:func:`read_tree`), deletes the directory and returns them as ``{relative path: bytes}``. The
return value of an actor task is owned by the caller, the driver, and kept in the node's object
store (or, when small, in the driver's memory), so it outlives the worker: when the worker dies,
the driver writes the files into the checkpoint directory (:func:`write_tree`), the very layout
the trainer's ``save`` makes, and ``--resume`` loads it.

The cost is one trainer save per step; ``--ray-step-snapshot auto`` bounds it: off above
:data:`AUTO_MAX_BYTES`, or when a snapshot takes more than :data:`AUTO_MAX_SHARE` of a step
(measured over the first steps: a collective save on few CPU cores, say). A collective trainer's
ranks must share the directory's file system (one node); its snapshot is the union of what they
wrote there, which rank 0 reads.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

#: ``--ray-step-snapshot auto`` keeps snapshots while one is at most this many bytes (2 GiB: a
#: model of ~130M parameters in float32 with AdamW's two moments is about 16 bytes a parameter).
AUTO_MAX_BYTES = 2 * 1024**3
#: ``--ray-step-snapshot auto`` keeps snapshots while a snapshot's median duration (rank 0's save) is
#: at most this share of the median step, judged once over :data:`AUTO_SAMPLES` steps.
AUTO_MAX_SHARE = 0.10
#: Steps whose snapshot durations and step times ``auto`` judges, after :data:`AUTO_WARMUP` steps.
AUTO_SAMPLES = 8
#: The first steps, not judged (model warm-up, allocator growth, first syncs).
AUTO_WARMUP = 2
#: The memory file system snapshots are written to when it has :data:`AUTO_MAX_BYTES` free.
SHM = Path("/dev/shm")
#: Seconds a save waits for the snapshot in progress once a worker died.
SETTLE_SECONDS = 60.0


def snapshot_base() -> str:
    """Where this node's snapshots are written: :data:`SHM` when it is a writable directory with
    :data:`AUTO_MAX_BYTES` free, else the temp directory."""
    try:
        stats = os.statvfs(SHM)
        if SHM.is_dir() and os.access(SHM, os.W_OK) and stats.f_bavail * stats.f_frsize >= AUTO_MAX_BYTES:
            return str(SHM)
    except OSError:
        pass
    return tempfile.gettempdir()


def snapshot_dir(base: str, token: str) -> Path:
    """The directory of snapshot ``token`` under ``base`` (the same path on every rank of a node)."""
    return Path(base) / f"plasmid-snapshot-{token}"


def read_tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` as ``{path relative to root: bytes}``; an empty directory as
    ``{"its/path/": b""}`` (so :func:`write_tree` makes the same layout)."""
    files: dict[str, bytes] = {}
    for directory, subdirs, names in os.walk(root):
        here = Path(directory)
        if not subdirs and not names and here != root:
            files[here.relative_to(root).as_posix() + "/"] = b""
        for name in names:
            files[(here / name).relative_to(root).as_posix()] = (here / name).read_bytes()
    return files


def write_tree(files: dict[str, bytes], root: str | Path) -> int:
    """Write what :func:`read_tree` read under ``root`` (created); the bytes written. A path that
    would leave ``root`` is a ``ValueError``."""
    target = Path(root)
    target.mkdir(parents=True, exist_ok=True)
    written = 0
    for relative, data in files.items():
        path = target / relative
        if ".." in Path(relative).parts or Path(relative).is_absolute():
            raise ValueError(f"snapshot path {relative!r} leaves the checkpoint directory {target}")
        if relative.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        written += len(data)
    return written
