"""Reading prompt rows from ``.jsonl`` and ``.parquet`` files, with errors that point at the row.

A ``.jsonl`` file holds one JSON object per line (blank lines are skipped) and is parsed line by
line with :mod:`json`, so that a malformed row is reported as ``file:line``. A ``.parquet`` file
is read with pyarrow; its rows are reported as ``file, row N`` (counting from 1). Both are the
layouts Hugging Face ``datasets`` reads and writes.

Keys may be dotted to reach into nested objects (verl's ``reward_model.ground_truth``; a parquet
struct column reads as an object): a key that a row holds as it is (``"a.b"`` at the top) is
taken first, else each dotted part is looked up in the object before it.
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
    """Which field of a row holds what (``--input-key``, ``--label-key``, ``--metadata-key``).

    :ivar label_required: every row must have a label (a non-null ``label`` value); when false
        (``--label-key`` left at its default), a file none of whose rows has one is read without
        labels, but a file where some rows have one still needs it in every row.
    """

    input: str = "prompt"
    label: str = "label"
    metadata: str = "metadata"
    label_required: bool = False


_MISSING: Any = object()


def lookup(row: dict[str, Any], key: str) -> Any:
    """``row[key]``, or for a dotted key the nested value (``row["a"]["b"]`` for ``"a.b"``);
    :data:`_MISSING` when there is none."""
    if key in row:
        return row[key]
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


def _missing_key(location: str, row: dict[str, Any], key: str, flag: str) -> UsageError:
    """The error for a row without ``key``, naming the keys it has where the lookup stopped."""
    where, value, parts = "its keys are", row, key.split(".")
    for depth, part in enumerate(parts[:-1]):
        inner = value.get(part)
        if not isinstance(inner, dict):
            break
        where, value = f"{'.'.join(parts[:depth + 1])!r} has keys", inner
    present = ", ".join(repr(name) for name in value) or "none"
    return UsageError(f"{location}: the row has no {key!r} key ({flag}); {where} {present}")


def read_records(path: str | Path, keys: Keys, flag: str) -> list[Record]:
    """Every row of ``path`` as a :class:`Record`; ``flag`` (``--prompt-data``) names the
    option that gave the path in error messages. Raises :class:`UsageError` on a missing,
    unreadable, empty or malformed file, on a row without ``keys.input``, and on a row without
    a label where one is needed (:attr:`Keys.label_required`, or other rows have one)."""
    path = Path(path)
    if path.suffix not in SUFFIXES:
        raise UsageError(f"{flag} {path}: unsupported file type '{path.suffix}'; use one of {', '.join(SUFFIXES)}")
    if not path.is_file():
        raise UsageError(f"{flag} {path}: no such file")
    rows = _jsonl_rows(path, flag) if path.suffix == ".jsonl" else _parquet_rows(path, flag)
    records, unlabelled = [], None
    for location, row in rows:
        record = _record(row, location, keys)
        if record.label is None:
            if keys.label_required:
                raise _missing_key(location, row, keys.label, "--label-key")
            unlabelled = unlabelled or (location, row)
        records.append(record)
    if not records:
        raise UsageError(f"{flag} {path}: the file has no rows")
    if unlabelled is not None and any(record.label is not None for record in records):
        raise _missing_key(*unlabelled, keys.label, "--label-key; other rows have one")
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
    prompt = lookup(row, keys.input)
    if prompt is _MISSING:
        raise _missing_key(location, row, keys.input, "--input-key")
    metadata = lookup(row, keys.metadata)
    if metadata is _MISSING or metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise UsageError(f"{location}: {keys.metadata!r} (--metadata-key) must be an object, "
                         f"got {type(metadata).__name__}")
    label = lookup(row, keys.label)
    return Record(prompt=prompt, label=None if label is _MISSING else label, metadata=metadata, location=location)
