"""The ``hf`` data source: prompt groups from a Hugging Face dataset, resumable at any prompt."""

from __future__ import annotations

import dataclasses
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


class HfDatasetSource(RecordStream):
    """A :class:`plasmid.protocols.DataSource` over split ``--hf-split`` of ``--hf-path``
    (opened as :mod:`plasmid_hf_datasets.loading` says).

    Each sample has ``prompt`` (the row's ``--hf-input-key`` text, or its chat messages with
    ``--hf-apply-chat-template``), ``tokens`` (the prompt's ids under ``--model``'s tokenizer),
    ``label`` (the row's ``--hf-label-key`` value) and ``metadata`` (its ``--hf-metadata-key``
    object); keys may be dotted into nested (struct) columns, and the label rule is the jsonl
    source's (:func:`plasmid.records.records_of`). Every row is read, checked and encoded at
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
        encoder = PromptEncoder(general.model, chat=options.hf_apply_chat_template, flag="--hf-apply-chat-template")
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

    def _read(self, encoder: PromptEncoder, dataset: Any, split: str, keys: Keys, flag: str) -> list[Record]:
        label = f"--hf-path {self.path} ({split})"
        records = [dataclasses.replace(record, prompt=encoder.check(record.prompt, record.location))
                   for record in records_of(rows_of(split_of(dataset, split, self.path, flag), label), keys)]
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


def encoded(encoder: PromptEncoder, record: Record) -> list[int]:
    """``record``'s prompt ids; text the tokenizer cannot encode is an error naming the row."""
    try:
        return encoder(record.prompt)
    except UsageError as exc:
        raise UsageError(f"{record.location}: {exc}") from None
