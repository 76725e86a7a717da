"""The ``jsonl`` data source: prompt groups from ``--prompt-data``, resumable at any prompt."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import ClassVar

from plasmid.config import Config
from plasmid.errors import UsageError
from plasmid.kernel_options import GeneralOptions, PromptOptions, RolloutOptions
from plasmid.options import Options
from plasmid.prompt_limits import PromptLimit, PromptScreen
from plasmid.records import Keys, Record, RecordStream
from plasmid_jsonl.options import JsonlOptions
from plasmid_jsonl.prompts import PromptEncoder
from plasmid_jsonl.reader import read_records
from plasmid_torch.vision import ImagePromptEncoder


class JsonlSource(RecordStream):
    """A :class:`plasmid.protocols.DataSource` over the rows of ``--prompt-data``.

    Each sample has ``prompt`` (the row's text, or its chat messages with
    ``--apply-chat-template``), ``tokens`` (the prompt's ids under ``--model``'s tokenizer),
    ``label`` (the row's ``--label-key`` value as stored; keys may be dotted, see
    :mod:`plasmid_jsonl.reader`) and ``metadata`` (its ``--metadata-key`` object). Chat messages may
    have image parts (OpenAI ``image_url`` with a data URL, file URL or path; Hugging Face ``image``
    with ``image``/``path``/``bytes``; paths relative to the file) for a vision-language ``--model``,
    and ``--image-key`` names a field of images that fill the messages' ``{"type": "image"}``
    placeholders or go first in the first user message (:func:`plasmid_torch.vision.with_column_images`):
    each image is decoded and checked at start-up (at most ``--max-image-pixels``; one-line errors
    naming file and row), the image
    tokens are expanded in ``tokens`` and ``metadata["plasmid_torch.vision"]`` holds a JSON reference
    to the images (:mod:`plasmid_torch.vision`); use ``--generate vision``. Every row is
    read and checked at construction: a row without the label is an error when ``--label-key``
    is given or other rows have one (with the default key, a file without any ``label`` gives
    ``None`` labels). Every prompt is tokenized then too (text the tokenizer cannot encode is an
    error naming the row and the character), and the rows longer than ``--max-prompt-length`` are
    dropped or refused (``--overlong-prompts``; :mod:`plasmid.prompt_limits`); prompts are
    tokenized again when drawn.

    Training visits the rows in file order, or with ``--rollout-shuffle`` in a fresh order each
    epoch (``random.Random(seed + epoch)``). With ``--num-epochs E``, :meth:`get_groups` raises
    :class:`~plasmid.errors.DataExhausted` when fewer than ``n`` prompts are left
    (the last, short batch is not served). The eval split is every row of ``--eval-prompt-data``
    in file order, or empty without it. Epochs, eval groups and resume are the kernel's
    :class:`~plasmid.records.RecordStream`.
    """

    option_classes: ClassVar[tuple[type[Options], ...]] = (JsonlOptions, GeneralOptions, RolloutOptions,
                                                           PromptOptions)

    def __init__(self, config: Config) -> None:
        options, general = JsonlOptions.of(config), GeneralOptions.of(config)
        if options.prompt_data is None:
            raise UsageError("the jsonl data source needs --prompt-data PATH (a .jsonl or .parquet file)")
        if not general.model:
            raise UsageError("the jsonl data source needs --model: its tokenizer encodes the prompts")
        self.path = str(options.prompt_data)
        encoder = ImagePromptEncoder(PromptEncoder(general.model, chat=options.apply_chat_template), general.model,
                                     max_pixels=options.max_image_pixels)
        keys = dataclasses.replace(options.keys, label_required=config.is_given("label_key"))
        self.image_key = options.image_key
        train = self._read(encoder, options.prompt_data, keys, "--prompt-data")
        eval_records = (self._read(encoder, options.eval_prompt_data, keys, "--eval-prompt-data")
                        if options.eval_prompt_data is not None else [])
        super().__init__(copies=RolloutOptions.of(config).n_samples_per_prompt, train=train,
                         eval_records=eval_records, encode=encoder, shuffle=options.rollout_shuffle,
                         seed=general.seed, num_epochs=options.num_epochs, source="jsonl",
                         data=f"--prompt-data {self.path}", screen=PromptScreen(PromptLimit.of(config)),
                         eval_data=f"--eval-prompt-data {options.eval_prompt_data}",
                         chat_template_flag=encoder.chat_template_flag)

    def _read(self, encoder: ImagePromptEncoder, path: Path, keys: Keys, flag: str) -> list[Record]:
        """The rows of ``path`` with checked prompts (``--image-key``'s images added to them); a prompt's
        images are decoded and checked now, relative paths resolved against the file's directory (see
        :meth:`ImagePromptEncoder.prepare`)."""
        records = []
        for record in read_records(path, keys, flag, self.image_key):
            prompt = encoder.check(record.prompt, record.location)
            prompt, metadata = encoder.prepare(prompt, record.metadata, record.location, Path(path).resolve().parent)
            records.append(dataclasses.replace(record, prompt=prompt, metadata=metadata))
        return records
