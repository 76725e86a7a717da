"""The ``tasks`` data source: prompt groups of a synthetic task, resumable at any prompt."""

from __future__ import annotations

from typing import Any, ClassVar

from plasmid.config import Config
from plasmid.errors import UsageError
from plasmid.groups import GroupStream, make_group
from plasmid.kernel_options import GeneralOptions, RolloutOptions
from plasmid.options import Options
from plasmid.types import Group
from plasmid_tasks.encoding import PromptEncoder
from plasmid_tasks.options import TaskOptions
from plasmid_tasks.recipe import prepare_tiny_model
from plasmid_tasks.split import TaskSplit
from plasmid_tasks.toolcalc import TOOLCALC_ALPHABET
from plasmid_torch.tiny import DIGITS_ALPHABET


class TaskSource(GroupStream):
    """A :class:`plasmid.protocols.DataSource` over one synthetic task (see :mod:`plasmid_tasks.tasks`).

    Each sample has ``prompt`` (the task's text), ``tokens`` (the prompt's ids under ``--model``'s
    tokenizer, or the char tokenizer when there is no model), ``label`` (the exact answer string)
    and ``metadata = {"task": name}``. Training walks the split's epochs endlessly
    (see :mod:`plasmid_tasks.split`).
    """

    option_classes: ClassVar[tuple[type[Options], ...]] = (TaskOptions, GeneralOptions, RolloutOptions)

    @staticmethod
    def prepare(config: Config) -> None:
        """Build the tiny model the quickstart recipe named, if it is not there yet
        (:func:`plasmid_tasks.recipe.prepare_tiny_model`; ``plasmid.session.prepare`` calls it)."""
        prepare_tiny_model(config)

    def __init__(self, config: Config) -> None:
        tasks, general = TaskOptions.of(config), GeneralOptions.of(config)
        self.prepare(config)  # a source built outside plasmid train still finds its model
        super().__init__(RolloutOptions.of(config).n_samples_per_prompt)
        self.task = tasks.build_task()
        self.split = TaskSplit(self.task, tasks.task_eval_size, general.seed)
        self.encode = PromptEncoder(general.model, TOOLCALC_ALPHABET if self.task.name == "toolcalc" else
                                    DIGITS_ALPHABET)

    # ------------------------------------------------------------------------------- training
    def next_prompt(self) -> tuple[str, list[int], str, dict[str, Any]]:
        """The next training item of the split's current epoch order (``position`` indexes the
        whole domain; eval items are skipped)."""
        prompt, label = self.task.example(self._next_train_item())
        return prompt, self.encode(prompt), label, {"task": self.task.name}

    def _next_train_item(self) -> int:
        while True:
            if self.position == self.split.domain_size:
                self.epoch, self.position = self.epoch + 1, 0
            item = self.split.item_at(self.epoch, self.position)
            self.position += 1
            if item is not None:
                return item

    def _group(self, item: int, *, copies: int, first_sample_index: int, group_index: int) -> Group:
        prompt, label = self.task.example(item)
        return make_group(prompt, self.encode(prompt), label, {"task": self.task.name}, copies=copies,
                          first_sample_index=first_sample_index, group_index=group_index)

    # ------------------------------------------------------------------------------- eval
    def eval_groups(self) -> list[Group]:
        """The eval split (see :mod:`plasmid_tasks.split`), one sample per group, numbered from 0."""
        return [self._group(item, copies=1, first_sample_index=position, group_index=position)
                for position, item in enumerate(self.split.eval_items)]

    # ------------------------------------------------------------------------------- resume
    def state_dict(self) -> dict[str, Any]:
        return {"stream": self.split.key, **self.stream_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["stream"] != self.split.key:
            raise UsageError(
                f"the tasks data source was saved for '{state['stream']}' but this run has '{self.split.key}'; "
                f"resume with the same --task, --task-length, --task-digits, --task-eval-size and --seed"
            )
        self.load_stream_state(state)
