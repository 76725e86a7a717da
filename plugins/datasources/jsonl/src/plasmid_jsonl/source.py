"""The ``jsonl`` data source: prompt groups from ``--prompt-data``, resumable at any prompt."""

from __future__ import annotations

import dataclasses
import math
import random
from pathlib import Path
from typing import Any, ClassVar

from plasmid.config import Config
from plasmid.errors import UsageError
from plasmid.groups import GroupStream, make_group
from plasmid.kernel_options import GeneralOptions, RolloutOptions
from plasmid.options import Options
from plasmid.types import Group
from plasmid_jsonl.options import JsonlOptions
from plasmid_jsonl.prompts import PromptEncoder
from plasmid_jsonl.reader import Keys, Record, read_records


class JsonlSource(GroupStream):
    """A :class:`plasmid.protocols.DataSource` over the rows of ``--prompt-data``.

    Each sample has ``prompt`` (the row's text, or its chat messages with
    ``--apply-chat-template``), ``tokens`` (the prompt's ids under ``--model``'s tokenizer),
    ``label`` (the row's ``--label-key`` value as stored; keys may be dotted, see
    :mod:`plasmid_jsonl.reader`) and ``metadata`` (its ``--metadata-key`` object). Every row is
    read and checked at construction: a row without the label is an error when ``--label-key``
    is given or other rows have one (with the default key, a file without any ``label`` gives
    ``None`` labels). Prompts are tokenized when drawn.

    Training visits the rows in file order, or with ``--rollout-shuffle`` in a fresh order each
    epoch (``random.Random(seed + epoch)``). With ``--num-epochs E``, :meth:`get_groups` raises
    :class:`~plasmid.errors.DataExhausted` when fewer than ``n`` prompts are left
    (the last, short batch is not served). The eval split is every row of ``--eval-prompt-data``
    in file order, or empty without it.
    """

    option_classes: ClassVar[tuple[type[Options], ...]] = (JsonlOptions, GeneralOptions, RolloutOptions)

    def __init__(self, config: Config) -> None:
        options, general = JsonlOptions.of(config), GeneralOptions.of(config)
        if options.prompt_data is None:
            raise UsageError("the jsonl data source needs --prompt-data PATH (a .jsonl or .parquet file)")
        if not general.model:
            raise UsageError("the jsonl data source needs --model: its tokenizer encodes the prompts")
        super().__init__(RolloutOptions.of(config).n_samples_per_prompt)
        self.path = str(options.prompt_data)
        self.shuffle = options.rollout_shuffle
        self.seed = general.seed
        self.num_epochs = options.num_epochs
        self.encode = PromptEncoder(general.model, chat=options.apply_chat_template)
        keys = dataclasses.replace(options.keys, label_required=config.is_given("label_key"))
        self.train = self._read(options.prompt_data, keys, "--prompt-data")
        self.eval = (self._read(options.eval_prompt_data, keys, "--eval-prompt-data")
                     if options.eval_prompt_data is not None else [])
        self._order: tuple[int, list[int]] | None = None  # (epoch, row order) of the current epoch

    def _read(self, path: Path, keys: Keys, flag: str) -> list[Record]:
        return [dataclasses.replace(record, prompt=self.encode.check(record.prompt, record.location))
                for record in read_records(path, keys, flag)]

    # ------------------------------------------------------------------------------- training
    def prompts_left(self) -> float:
        """New prompts that the remaining epochs hold (``inf`` without ``--num-epochs``)."""
        if self.num_epochs is None:
            return math.inf
        return (self.num_epochs - self.epoch) * len(self.train) - self.position

    def exhausted_message(self, left: float, needed: int) -> str:
        return (f"--prompt-data {self.path}: the {self.num_epochs} epoch(s) of --num-epochs are used up: "
                f"{left} prompt(s) left, {needed} needed; raise --num-epochs to train longer")

    def next_prompt(self) -> tuple[Any, list[int], Any, dict[str, Any]]:
        record = self._next_record()
        return record.prompt, self.encode(record.prompt), record.label, record.metadata

    def _next_record(self) -> Record:
        if self.position == len(self.train):
            self.epoch, self.position = self.epoch + 1, 0
        record = self.train[self._epoch_order()[self.position]]
        self.position += 1
        return record

    def _epoch_order(self) -> list[int]:
        if self._order is None or self._order[0] != self.epoch:
            order = list(range(len(self.train)))
            if self.shuffle:
                random.Random(self.seed + self.epoch).shuffle(order)
            self._order = (self.epoch, order)
        return self._order[1]

    def _group(self, record: Record, *, copies: int, first_sample_index: int, group_index: int) -> Group:
        return make_group(record.prompt, self.encode(record.prompt), record.label, record.metadata, copies=copies,
                          first_sample_index=first_sample_index, group_index=group_index)

    # ------------------------------------------------------------------------------- eval
    def eval_groups(self) -> list[Group]:
        """Every row of ``--eval-prompt-data`` in file order, one sample per group, numbered from 0."""
        return [self._group(record, copies=1, first_sample_index=position, group_index=position)
                for position, record in enumerate(self.eval)]

    # ------------------------------------------------------------------------------- resume
    def state_dict(self) -> dict[str, Any]:
        return {"prompts": len(self.train), **self.stream_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["prompts"] != len(self.train):
            raise UsageError(
                f"the jsonl data source was saved over {state['prompts']} prompts but --prompt-data {self.path} "
                f"now has {len(self.train)}; resume with the same data"
            )
        self.load_stream_state(state)
