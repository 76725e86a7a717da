"""Prompt rows held in memory, shared by the data sources that read whole files (``jsonl``,
``hf``): dotted keys into nested rows, the label rule, and :class:`RecordStream`, the epoch
order (file order or shuffled per epoch), ``--num-epochs`` and exact resume over those rows.

Keys may be dotted to reach into nested objects (verl's ``reward_model.ground_truth``; a parquet
struct column reads as an object): a key that a row holds as it is (``"a.b"`` at the top) is
taken first, else each dotted part is looked up in the object before it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from plasmid.errors import UsageError
from plasmid.groups import GroupStream, make_group
from plasmid.types import Group, PromptReport

if TYPE_CHECKING:
    from plasmid.prompt_limits import PromptScreen


@dataclass(frozen=True)
class Record:
    """One row: its prompt (as stored), label (any JSON value, ``None`` when absent) and
    metadata (a dict), and where it was read from (``file:line``, ``file, row N``)."""

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


MISSING: Any = object()


def lookup(row: dict[str, Any], key: str) -> Any:
    """``row[key]``, or for a dotted key the nested value (``row["a"]["b"]`` for ``"a.b"``);
    :data:`MISSING` when there is none."""
    if key in row:
        return row[key]
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return MISSING
        value = value[part]
    return value


def missing_key(location: str, row: dict[str, Any], key: str, flag: str) -> UsageError:
    """The error for a row without ``key``, naming the keys it has where the lookup stopped."""
    where, value, parts = "its keys are", row, key.split(".")
    for depth, part in enumerate(parts[:-1]):
        inner = value.get(part)
        if not isinstance(inner, dict):
            break
        where, value = f"{'.'.join(parts[:depth + 1])!r} has keys", inner
    present = ", ".join(repr(name) for name in value) or "none"
    return UsageError(f"{location}: the row has no {key!r} key ({flag}); {where} {present}")


def record_of(row: Any, location: str, keys: Keys) -> Record:
    """The :class:`Record` of one row; a row that is not an object, has no ``keys.input`` or a
    metadata value that is not an object is a :class:`UsageError` naming ``location``."""
    if not isinstance(row, dict):
        raise UsageError(f"{location}: expected an object with a {keys.input!r} field, got {type(row).__name__}")
    prompt = lookup(row, keys.input)
    if prompt is MISSING:
        raise missing_key(location, row, keys.input, "--input-key")
    metadata = lookup(row, keys.metadata)
    if metadata is MISSING or metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise UsageError(f"{location}: {keys.metadata!r} (--metadata-key) must be an object, "
                         f"got {type(metadata).__name__}")
    label = lookup(row, keys.label)
    return Record(prompt=prompt, label=None if label is MISSING else label, metadata=metadata, location=location)


def records_of(rows: Iterable[tuple[str, Any]], keys: Keys) -> list[Record]:
    """Every ``(location, row)`` as a :class:`Record` (:func:`record_of`), with the label rule:
    a row without a label is an error when :attr:`Keys.label_required` or when other rows have
    one. May be empty (the caller names its empty file)."""
    records, unlabelled = [], None
    for location, row in rows:
        record = record_of(row, location, keys)
        if record.label is None:
            if keys.label_required:
                raise missing_key(location, row, keys.label, "--label-key")
            unlabelled = unlabelled or (location, row)
        records.append(record)
    if unlabelled is not None and any(record.label is not None for record in records):
        raise missing_key(*unlabelled, keys.label, "--label-key; other rows have one")
    return records


class RecordStream(GroupStream):
    """A data source's stream over in-memory training :class:`Record` s, plus an eval split.

    Every row, training and eval, is encoded with ``encode`` when the stream is built, so that a
    prompt the tokenizer cannot encode stops the run at start-up (``encode`` raises
    :class:`UsageError`, which is re-raised naming the row's location). With a ``screen``
    (:class:`plasmid.prompt_limits.PromptScreen`) the rows whose prompt is too long are dropped
    (or refused) there too, and :attr:`prompt_report` says what was found (a split left empty is
    an error). A drawn prompt is encoded again (ids are not kept: a large data set's ids would
    outweigh its text).

    Training visits ``train`` in order, or with ``shuffle`` in a fresh order each epoch
    (``random.Random(seed + epoch)``); ``encode`` gives a drawn prompt's token ids. With
    ``num_epochs`` E, :meth:`get_groups` raises :class:`~plasmid.errors.DataExhausted` when
    fewer prompts are left than asked for. ``state_dict`` holds the number of training rows,
    checked on ``load_state_dict`` (resuming over other data is a :class:`UsageError`), and the
    stream's position, so a resumed source serves exactly the prompts the saved one would have.

    :param source: the source's name in errors (``"jsonl"``).
    :param data: what gave the rows, in errors (``"--prompt-data rows.jsonl"``).
    :param epochs_flag: the flag that sets ``num_epochs``, in errors.
    :param eval_data: what gave the eval rows, in errors (``"--eval-prompt-data eval.jsonl"``).
    :param chat_template_flag: reported in :attr:`prompt_report` (see
        :class:`~plasmid.types.PromptReport`): the prompts are plain text and the tokenizer has a
        chat template that this flag would apply.
    """

    def __init__(self, *, copies: int, train: list[Record], eval_records: list[Record],
                 encode: Callable[[Any], list[int]], shuffle: bool, seed: int, num_epochs: int | None,
                 source: str, data: str, epochs_flag: str = "--num-epochs", screen: PromptScreen | None = None,
                 eval_data: str = "the eval prompts", chat_template_flag: str = "") -> None:
        super().__init__(copies)
        self.encode = encode
        self.screen = screen
        train = self._checked(train, data)
        eval_records = self._checked(eval_records, eval_data)
        self.chat_template_flag = chat_template_flag
        self.train, self.eval = train, eval_records
        self.shuffle, self.seed, self.num_epochs = shuffle, seed, num_epochs
        self.source, self.data, self.epochs_flag = source, data, epochs_flag
        self._order: tuple[int, list[int]] | None = None  # (epoch, row order) of the current epoch

    def _checked(self, records: list[Record], data: str) -> list[Record]:
        """``records`` each encoded (a failure names its row) and, with a screen, those that fit."""
        def measure(record: Record) -> tuple[str, int]:
            try:
                return record.location, len(self.encode(record.prompt))
            except UsageError as exc:
                raise UsageError(f"{record.location}: {exc}") from None

        if self.screen is None:
            return [record for record in records if measure(record)]
        return self.screen.kept(records, measure, data)

    @property
    def prompt_report(self) -> PromptReport:
        """What the rows held (:class:`~plasmid.protocols.SupportsPromptReport`)."""
        if self.screen is None:
            return PromptReport(data=self.data, rows=len(self.train) + len(self.eval),
                                chat_template_flag=self.chat_template_flag)
        return self.screen.report(self.data, self.chat_template_flag)

    # ------------------------------------------------------------------------------- training
    def prompts_left(self) -> float:
        """New prompts that the remaining epochs hold (``inf`` without ``num_epochs``)."""
        if self.num_epochs is None:
            return math.inf
        return (self.num_epochs - self.epoch) * len(self.train) - self.position

    def exhausted_message(self, left: float, needed: int) -> str:
        return (f"{self.data}: the {self.num_epochs} epoch(s) of {self.epochs_flag} are used up: "
                f"{left} prompt(s) left, {needed} needed; raise {self.epochs_flag} to train longer")

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

    # ------------------------------------------------------------------------------- eval
    def eval_groups(self) -> list[Group]:
        """Every eval record in order, one sample per group, numbered from 0."""
        return [make_group(record.prompt, self.encode(record.prompt), record.label, record.metadata, copies=1,
                           first_sample_index=position, group_index=position)
                for position, record in enumerate(self.eval)]

    # ------------------------------------------------------------------------------- resume
    def state_dict(self) -> dict[str, Any]:
        return {"prompts": len(self.train), **self.stream_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["prompts"] != len(self.train):
            raise UsageError(
                f"the {self.source} data source was saved over {state['prompts']} prompts but {self.data} "
                f"now has {len(self.train)}; resume with the same data"
            )
        self.load_stream_state(state)
