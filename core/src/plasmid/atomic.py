"""Durable writes: a file is either its old content or its new content, never a torn mix, and
what a call has written is on disk (fsynced) when it returns, except :func:`append_line`'s lines,
which its caller makes durable in batches with :func:`fsync_file`.

- :func:`write_atomic` rewrites a whole file: it writes a temporary file next to it, fsyncs it,
  ``os.replace``-s it over the target and fsyncs the directory, so a crash or a full disk at any
  point leaves the old file in place (the temporary is removed on failure).
- :func:`append_line` appends one line, not fsynced (``metrics.jsonl`` gets a line a step and is
  fsynced before each checkpoint): a crash can tear only the last line, which readers of
  append-only logs must tolerate.
- :func:`fsync_tree` makes a directory written by someone else (a trainer's checkpoint) durable
  before it is renamed into place.

Every ``OSError`` these raise names the path (``exc.filename``), so the CLI can report a full
disk as one line: ``plasmid: error: disk full writing PATH``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def naming(path: str | os.PathLike[str]) -> Iterator[None]:
    """Re-raise an ``OSError`` that names no file (a ``write`` or ``fsync`` hitting a full disk)
    as one naming ``path``."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None or exc.errno is None:
            raise
        raise OSError(exc.errno, exc.strerror, os.fspath(path)) from exc


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync directory ``path``, so the names created, renamed or removed in it are durable."""
    with naming(path):
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def fsync_file(path: str | os.PathLike[str]) -> None:
    """Make what was written to the existing file ``path`` durable (fsync it)."""
    with naming(path):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def fsync_tree(root: str | os.PathLike[str]) -> None:
    """fsync every regular file and directory under ``root`` (``root`` included); symbolic
    links are not followed."""
    for directory, _, files in os.walk(root):
        for name in files:
            path = os.path.join(directory, name)
            if not os.path.islink(path):
                fsync_file(path)
        fsync_dir(directory)


def write_atomic(path: str | os.PathLike[str], data: str | bytes) -> None:
    """Replace ``path``'s content with ``data`` (``str`` is written as UTF-8), durably and
    atomically: readers and a crash see the old or the new content, never a part."""
    target = Path(path)
    temporary = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    payload = data.encode() if isinstance(data, str) else data
    try:
        with naming(temporary), open(temporary, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)


def append_line(path: str | os.PathLike[str], line: str) -> None:
    """Append ``line`` (a newline is added) to ``path``. When this returns the line is in the
    operating system's cache (a crash of the process loses nothing; a power loss may, until
    :func:`fsync_file`); a crash can leave it torn at the end of the file, never an earlier one."""
    created = not os.path.exists(path)
    with naming(path), open(path, "a", encoding="utf-8") as handle:
        handle.write(line + "\n")
    if created:
        fsync_dir(Path(path).parent)
