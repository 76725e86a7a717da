"""The ``hf`` data source: prompt groups from a Hugging Face dataset, resumable at any prompt."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from plasmid.config import Config
from plasmid.errors import UsageError
from plasmid.kernel_options import GeneralOptions, PromptOptions, RolloutOptions
from plasmid.options import Options
from plasmid.prompt_limits import PromptLimit, PromptScreen
from plasmid.records import Keys, Record, RecordStream, records_of
from plasmid_hf_datasets.loading import open_dataset, rows_of, split_of
from plasmid_hf_datasets.options import HfDatasetOptions
from plasmid_torch.prompts import PromptEncoder
from plasmid_torch.vision import ImagePromptEncoder, collect_column, with_column_images


class HfDatasetSource(RecordStream):
    """A :class:`plasmid.protocols.DataSource` over split ``--hf-split`` of ``--hf-path``
    (opened as :mod:`plasmid_hf_datasets.loading` says).

    Each sample has ``prompt`` (the row's ``--hf-input-key`` text, or its chat messages with
    ``--hf-apply-chat-template``), ``tokens`` (the prompt's ids under ``--model``'s tokenizer),
    ``label`` (the row's ``--hf-label-key`` value) and ``metadata`` (its ``--hf-metadata-key``
    object); keys may be dotted into nested (struct) columns, and the label rule is the jsonl
    source's (:func:`plasmid.records.records_of`). For a vision-language ``--model``, chat messages may
    have image parts as in the jsonl source, and ``--hf-image-column`` names a column of images (a
    ``datasets.Image`` feature, a list of them, bytes, paths or ``{"bytes", "path"}`` structs) that fill
    the messages' ``{"type": "image"}`` placeholders or go first in the first user message
    (:func:`plasmid_torch.vision.with_column_images`); every image is decoded and checked at start-up
    (at most ``--hf-max-image-pixels``; one-line errors naming path, split and row), paths resolve
    against ``--hf-path``'s directory, and samples carry the images as
    :mod:`plasmid_torch.vision` says (``metadata["plasmid_torch.vision"]``, a JSON reference; use
    ``--generate vision``). Every row is read, checked and encoded at
    construction; with ``--hf-max-prompt-tokens N`` the rows whose prompt has more than N tokens
    are dropped (a split left empty is an error), and :attr:`dropped` counts them per split. Then,
    as for every source over prompt files (:class:`~plasmid.records.RecordStream`), a prompt the
    tokenizer cannot encode is an error naming its row, and the rows longer than
    ``--max-prompt-length`` are dropped or refused (``--overlong-prompts``).

    Training visits the kept rows in dataset order, or with ``--hf-shuffle`` in a fresh order
    each epoch (``random.Random(seed + epoch)``); ``--hf-num-epochs`` bounds the passes. The
    eval split is ``--hf-eval-split`` (filtered alike), or empty without it. Epochs, eval groups
    and exact resume are the kernel's :class:`~plasmid.records.RecordStream`.
    """

    option_classes: ClassVar[tuple[type[Options], ...]] = (HfDatasetOptions, GeneralOptions, RolloutOptions,
                                                           PromptOptions)

    def __init__(self, config: Config) -> None:
        options, general = HfDatasetOptions.of(config), GeneralOptions.of(config)
        if options.hf_path is None:
            raise UsageError("the hf data source needs --hf-path PATH (a saved dataset directory or data files)")
        if not general.model:
            raise UsageError("the hf data source needs --model: its tokenizer encodes the prompts")
        self.path = options.hf_path
        self.max_tokens = options.hf_max_prompt_tokens
        self.image_column = options.hf_image_column
        path = Path(options.hf_path).resolve()
        #: where relative image paths resolve: ``--hf-path`` itself when a directory, else its directory
        self.base_dir = path if path.is_dir() else path.parent
        encoder = ImagePromptEncoder(PromptEncoder(general.model, chat=options.hf_apply_chat_template,
                                                   flag="--hf-apply-chat-template"),
                                     general.model, max_pixels=options.hf_max_image_pixels)
        keys = dataclasses.replace(options.keys, label_required=config.is_given("hf_label_key"))
        dataset = open_dataset(options.hf_path, options.hf_data_files)
        self.dropped: dict[str, int] = {}
        train = self._read(encoder, dataset, options.hf_split, keys, "--hf-split")
        eval_records = (self._read(encoder, dataset, options.hf_eval_split, keys, "--hf-eval-split")
                        if options.hf_eval_split is not None else [])
        super().__init__(copies=RolloutOptions.of(config).n_samples_per_prompt, train=train,
                         eval_records=eval_records, encode=encoder, shuffle=options.hf_shuffle, seed=general.seed,
                         num_epochs=options.hf_num_epochs, source="hf",
                         data=f"--hf-path {self.path} (split {options.hf_split})", epochs_flag="--hf-num-epochs",
                         screen=PromptScreen(PromptLimit.of(config)),
                         eval_data=f"--hf-path {self.path} (split {options.hf_eval_split})",
                         chat_template_flag=encoder.chat_template_flag)

    def _read(self, encoder: ImagePromptEncoder, dataset: Any, split: str, keys: Keys, flag: str) -> list[Record]:
        label = f"--hf-path {self.path} ({split})"
        rows = split_of(dataset, split, self.path, flag)
        images: list[Any] = []
        records = []
        for record in records_of(self._rows(rows, label, images), keys):
            prompt = record.prompt
            if self.image_column is not None:
                prompt = with_column_images(prompt, images[len(records)], record.location)
            prompt = encoder.check(prompt, record.location)
            prompt, metadata = encoder.prepare(prompt, record.metadata, record.location, self.base_dir)
            records.append(dataclasses.replace(record, prompt=prompt, metadata=metadata))
        if not records:
            raise UsageError(f"{label}: the split has no rows")
        if self.max_tokens is not None:
            kept = [record for record in records if len(encoded(encoder, record)) <= self.max_tokens]
            self.dropped[split] = len(records) - len(kept)
            if not kept:
                raise UsageError(f"{label}: every one of its {len(records)} prompts has more than "
                                 f"--hf-max-prompt-tokens {self.max_tokens} tokens; raise it")
            records = kept
        return records

    def _rows(self, rows: Any, label: str, images: list[Any]) -> Iterator[tuple[str, dict[str, Any]]]:
        """:func:`rows_of`, appending each row's ``--hf-image-column`` value to ``images`` (a split
        without that column is an error naming the columns it has)."""
        column = self.image_column
        if column is not None and column.split(".")[0] not in rows.column_names:
            raise UsageError(f"--hf-image-column {column}: {label} has no such column; its columns are "
                             f"{', '.join(rows.column_names)}")
        yield from rows_of(rows, label) if column is None else collect_column(rows_of(rows, label), column, images)


def encoded(encoder: ImagePromptEncoder, record: Record) -> list[int]:
    """``record``'s prompt ids; text the tokenizer cannot encode is an error naming the row."""
    try:
        return encoder(record.prompt)
    except UsageError as exc:
        raise UsageError(f"{record.location}: {exc}") from None
