"""Opening ``--hf-path`` with Hugging Face ``datasets``, and its rows with their locations.

What ``--hf-path`` names decides how it is opened:

- a directory written by ``save_to_disk`` (it holds ``dataset_dict.json``, or ``state.json``
  with ``dataset_info.json``): ``datasets.load_from_disk``;
- a data file (``.json``/``.jsonl``, ``.parquet``, ``.csv``, ``.arrow``): ``load_dataset`` with
  the builder of its suffix and the file as ``data_files`` (its rows are the ``train`` split);
- anything else (a directory of data files, a builder name such as ``json`` with
  ``--hf-data-files``): ``load_dataset(path, data_files=...)`` as given.

Every failure is one :class:`UsageError` line naming ``--hf-path`` (and the split).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from plasmid.errors import UsageError

#: Data file suffixes and the ``datasets`` builder that reads them.
BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow"}


def is_saved_dataset(path: Path) -> bool:
    """Whether ``path`` is a directory that ``save_to_disk`` wrote (a Dataset or a DatasetDict)."""
    return path.is_dir() and ((path / "dataset_dict.json").is_file()
                              or ((path / "state.json").is_file() and (path / "dataset_info.json").is_file()))


def open_dataset(hf_path: str, data_files: tuple[str, ...]) -> Any:
    """The ``Dataset`` or ``DatasetDict`` that ``hf_path`` (and ``--hf-data-files``) name
    (module docstring); one-line errors."""
    import datasets

    path = Path(hf_path)
    what = f"--hf-path {hf_path}"
    try:
        if is_saved_dataset(path):
            if data_files:
                raise UsageError(f"{what} is a saved dataset directory (load_from_disk): --hf-data-files does not "
                                 f"apply to it")
            return datasets.load_from_disk(str(path))
        if path.is_file():
            builder = BUILDERS.get(path.suffix)
            if builder is None:
                raise UsageError(f"{what}: unsupported file type '{path.suffix}'; use one of "
                                 f"{', '.join(BUILDERS)}, or a saved dataset directory")
            return datasets.load_dataset(builder, data_files=[str(path), *data_files])
        if not data_files and not path.is_dir() and (path.is_absolute() or path.suffix or "/" in hf_path):
            raise UsageError(f"{what}: no such file or directory")
        return datasets.load_dataset(hf_path, data_files=list(data_files) or None)
    except UsageError:
        raise
    except Exception as exc:  # noqa: BLE001 - datasets raises many kinds; each is about the user's data
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise UsageError(f"{what}: datasets cannot open it ({type(exc).__name__}: {reason[:300]})") from None


def split_of(dataset: Any, split: str, hf_path: str, flag: str) -> Any:
    """Split ``split`` of a ``DatasetDict``; a ``Dataset`` (saved without splits) is its own
    ``train`` split. An unknown split is an error naming the ones there are."""
    import datasets

    if isinstance(dataset, datasets.DatasetDict):
        if split not in dataset:
            raise UsageError(f"{flag} {split}: --hf-path {hf_path} has no such split; it has "
                             f"{', '.join(sorted(dataset)) or 'none'}")
        return dataset[split]
    if split != "train":
        raise UsageError(f"{flag} {split}: --hf-path {hf_path} is a single dataset without splits (use 'train')")
    return dataset


def rows_of(dataset: Any, label: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(location, row)`` for every row, located as ``LABEL, row N`` (counting from 1); struct
    columns are dicts, list columns lists, as ``datasets`` gives them."""
    for number, row in enumerate(dataset, start=1):
        yield f"{label}, row {number}", row
