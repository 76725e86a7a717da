"""The ``tasks`` data source: prompt groups of a synthetic task, resumable at any prompt."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from plasmid.config import Config
from plasmid.errors import UsageError
from plasmid.groups import group_from_state, group_to_state, make_group
from plasmid.types import Group
from plasmid_tasks.encoding import PromptEncoder
from plasmid_tasks.split import TaskSplit
from plasmid_tasks.tasks import Task, make_task


def task_from_options(option: Any) -> Task:
    """The task chosen by ``--task``, ``--task-length`` and ``--task-digits``."""
    return make_task(option.task, length=option.task_length, digits=option.task_digits)


class TaskSource:
    """A :class:`plasmid.protocols.DataSource` over one synthetic task (see :mod:`plasmid_tasks.tasks`).

    Each sample has ``prompt`` (the task's text), ``tokens`` (the prompt's ids under ``--model``'s
    tokenizer, or the char tokenizer when there is no model), ``label`` (the exact answer string)
    and ``metadata = {"task": name}``. Training walks the split's epochs endlessly
    (see :mod:`plasmid_tasks.split`).
    """

    def __init__(self, config: Config) -> None:
        option = config.option
        self.task = task_from_options(option)
        self.split = TaskSplit(self.task, option.task_eval_size, option.seed)
        self.copies = option.n_samples_per_prompt
        self.encode = PromptEncoder(option.model)
        self.epoch = 0
        self.position = 0  # next position in the current epoch's order of the whole domain
        self.next_sample_index = 0
        self.next_group_index = 0
        self.given_back: deque[Group] = deque()

    # ------------------------------------------------------------------------------- training
    def get_groups(self, n: int) -> list[Group]:
        """The next ``n`` groups: given-back groups first, then new prompts."""
        groups = []
        while len(groups) < n and self.given_back:
            groups.append(self.given_back.popleft())
        while len(groups) < n:
            groups.append(self._new_group(self._next_train_item()))
        return groups

    def add_groups(self, groups: Sequence[Group]) -> None:
        self.given_back.extend(groups)

    def _next_train_item(self) -> int:
        while True:
            if self.position == self.split.domain_size:
                self.epoch, self.position = self.epoch + 1, 0
            item = self.split.item_at(self.epoch, self.position)
            self.position += 1
            if item is not None:
                return item

    def _new_group(self, item: int) -> Group:
        group = self._group(item, copies=self.copies, first_sample_index=self.next_sample_index,
                            group_index=self.next_group_index)
        self.next_sample_index += self.copies
        self.next_group_index += 1
        return group

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
        return {
            "stream": self.split.key,
            "epoch": self.epoch,
            "position": self.position,
            "next_sample_index": self.next_sample_index,
            "next_group_index": self.next_group_index,
            "given_back": [group_to_state(group) for group in self.given_back],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["stream"] != self.split.key:
            raise UsageError(
                f"the tasks data source was saved for '{state['stream']}' but this run has '{self.split.key}'; "
                f"resume with the same --task, --task-length, --task-digits, --task-eval-size and --seed"
            )
        self.epoch = state["epoch"]
        self.position = state["position"]
        self.next_sample_index = state["next_sample_index"]
        self.next_group_index = state["next_group_index"]
        self.given_back = deque(group_from_state(group) for group in state["given_back"])
