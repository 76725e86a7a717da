"""Reading prompt rows from ``.jsonl`` and ``.parquet`` files, with errors that point at the row.

A ``.jsonl`` file holds one JSON object per line (blank lines are skipped) and is parsed line by
line with :mod:`json`, so that a malformed row is reported as ``file:line``. A ``.parquet`` file
is read with pyarrow; its rows are reported as ``file, row N`` (counting from 1). Both are the
layouts Hugging Face ``datasets`` reads and writes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plasmid.errors import UsageError

SUFFIXES = (".jsonl", ".parquet")


@dataclass(frozen=True)
class Record:
    """One row: its prompt (as stored), label (any JSON value, ``None`` when absent) and
    metadata (a dict), and where it was read from (``file:line`` or ``file, row N``)."""

    prompt: Any
    label: Any
    metadata: dict[str, Any] = field(default_factory=dict)
    location: str = ""


@dataclass(frozen=True)
class Keys:
    """Which field of a row holds what (``--input-key``, ``--label-key``, ``--metadata-key``)."""

    input: str = "prompt"
    label: str = "label"
    metadata: str = "metadata"


def read_records(path: str | Path, keys: Keys, flag: str) -> list[Record]:
    """Every row of ``path`` as a :class:`Record`; ``flag`` (``--prompt-data``) names the
    option that gave the path in error messages. Raises :class:`UsageError` on a missing,
    unreadable, empty or malformed file and on a row without ``keys.input``."""
    path = Path(path)
    if path.suffix not in SUFFIXES:
        raise UsageError(f"{flag} {path}: unsupported file type '{path.suffix}'; use one of {', '.join(SUFFIXES)}")
    if not path.is_file():
        raise UsageError(f"{flag} {path}: no such file")
    rows = _jsonl_rows(path, flag) if path.suffix == ".jsonl" else _parquet_rows(path, flag)
    records = [_record(row, location, keys) for location, row in rows]
    if not records:
        raise UsageError(f"{flag} {path}: the file has no rows")
    return records


def _jsonl_rows(path: Path, flag: str) -> Iterator[tuple[str, Any]]:
    try:
        with path.open(encoding="utf-8") as lines:
            for line_number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise UsageError(f"{path}:{line_number}: malformed JSON: {exc.msg} (column {exc.colno})") from None
                yield f"{path}:{line_number}", row
    except UnicodeDecodeError as exc:
        raise UsageError(f"{flag} {path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot read it ({exc.strerror or exc})") from None


def _parquet_rows(path: Path, flag: str) -> Iterator[tuple[str, Any]]:
    import pyarrow
    import pyarrow.parquet

    try:
        table = pyarrow.parquet.read_table(path)
    except (OSError, pyarrow.ArrowException) as exc:
        raise UsageError(f"{flag} {path}: cannot read it as parquet ({exc})") from None
    for row_number, row in enumerate(table.to_pylist(), start=1):
        yield f"{path}, row {row_number}", row


def _record(row: Any, location: str, keys: Keys) -> Record:
    if not isinstance(row, dict):
        raise UsageError(f"{location}: expected an object with a {keys.input!r} field, got {type(row).__name__}")
    if keys.input not in row:
        present = ", ".join(repr(key) for key in row) or "none"
        raise UsageError(f"{location}: the row has no {keys.input!r} key (--input-key); its keys are {present}")
    metadata = row.get(keys.metadata)
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise UsageError(f"{location}: {keys.metadata!r} (--metadata-key) must be an object, "
                         f"got {type(metadata).__name__}")
    return Record(prompt=row[keys.input], label=row.get(keys.label), metadata=metadata, location=location)
