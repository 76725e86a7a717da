"""Reading prompt rows from ``.jsonl`` and ``.parquet`` files, with errors that point at the row.

A ``.jsonl`` file holds one JSON object per line (blank lines are skipped) and is parsed line by
line with :mod:`json`, so that a malformed row is reported as ``file:line``. A ``.parquet`` file
is read with pyarrow; its rows are reported as ``file, row N`` (counting from 1). Both are the
layouts Hugging Face ``datasets`` reads and writes.

Rows become records through the kernel's :mod:`plasmid.records` (dotted keys into nested
objects, the label rule), which the ``hf`` data source shares.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from plasmid.errors import UsageError
from plasmid.records import Keys, Record, lookup, records_of

__all__ = ["SUFFIXES", "Keys", "Record", "lookup", "read_records"]

SUFFIXES = (".jsonl", ".parquet")


def read_records(path: str | Path, keys: Keys, flag: str, image_key: str | None = None) -> list[Record]:
    """Every row of ``path`` as a :class:`Record`; ``flag`` (``--prompt-data``) names the
    option that gave the path in error messages. Raises :class:`UsageError` on a missing,
    unreadable, empty or malformed file, on a row without ``keys.input``, and on a row without
    a label where one is needed (:attr:`Keys.label_required`, or other rows have one). With
    ``image_key`` (``--image-key``), each row's images under that key (dotted for nested objects;
    a row without it has none) become image parts of its prompt
    (:func:`plasmid_torch.vision.with_column_images`; not decoded here)."""
    path = Path(path)
    if path.suffix not in SUFFIXES:
        raise UsageError(f"{flag} {path}: unsupported file type '{path.suffix}'; use one of {', '.join(SUFFIXES)}")
    if not path.is_file():
        raise UsageError(f"{flag} {path}: no such file")
    rows = _jsonl_rows(path, flag) if path.suffix == ".jsonl" else _parquet_rows(path, flag)
    if image_key is None:
        records = records_of(rows, keys)
    else:
        from plasmid_torch.vision import collect_column, with_column_images

        images: list[Any] = []
        records = records_of(collect_column(rows, image_key, images), keys)
        records = [dataclasses.replace(record, prompt=with_column_images(record.prompt, value, record.location))
                   for record, value in zip(records, images, strict=True)]
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
