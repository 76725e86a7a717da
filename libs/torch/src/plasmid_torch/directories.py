"""Whole directories put in place at once: a model written by ``plasmid export``,
``plasmid model-from-gguf`` or the disk weight sync is built under a hidden sibling name and
renamed over its target only when complete, so a reader or a crash sees the old directory or the
new one, never a mix."""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

from plasmid.atomic import fsync_dir


def sibling(path: str | os.PathLike[str], kind: str) -> Path:
    """A hidden, unused name beside ``path``: ``.NAME.KIND-PID-RANDOM``."""
    path = Path(path)
    return path.with_name(f".{path.name}.{kind}-{os.getpid()}-{secrets.token_hex(4)}")


def replace_dir(new: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    """Put directory ``new`` at ``target`` and fsync their parent. An existing ``target`` is moved
    aside (to a hidden :func:`sibling`) first, deleted once ``new`` is in place, and moved back when
    that rename fails: a crash leaves the old or the new directory at ``target``, and at worst a
    hidden leftover beside it."""
    target = Path(target)
    aside = sibling(target, "old") if target.exists() else None
    if aside:
        os.replace(target, aside)
    try:
        os.replace(new, target)
    except BaseException:
        if aside:
            os.replace(aside, target)
        raise
    fsync_dir(target.parent)
    if aside:
        shutil.rmtree(aside, ignore_errors=True)
