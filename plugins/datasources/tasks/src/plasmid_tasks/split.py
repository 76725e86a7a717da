"""The train/eval split of a task, and the order in which training visits its prompts.

Held-out tasks (all but mod10): the eval split is ``eval_size`` items chosen by a permutation
keyed by the task alone (so it is the same for every ``--seed``), listed in increasing item
order; training never sees them. mod10 has only 100 prompts, too few to hold any out: its eval
split is all 100 in order (``0+0=``, ``0+1=``, ... ``9+9=``), and training visits the same 100,
reshuffled each epoch. Epoch ``e`` of training visits the domain in the order of a permutation
keyed by the task, ``--seed`` and ``e``, skipping held-out items.
"""

from __future__ import annotations

from plasmid.errors import UsageError
from plasmid_tasks.permutation import Permutation
from plasmid_tasks.tasks import Task


class TaskSplit:
    """Which items are evaluated, and which item sits at each position of each training epoch.

    :ivar eval_items: the eval split, in its fixed order.
    :ivar key: identifies the training stream (task, eval size, seed); stored with resume state.
    """

    def __init__(self, task: Task, eval_size: int, seed: int) -> None:
        self.task = task
        self.seed = seed
        if task.holds_out_eval:
            if not 1 <= eval_size < task.domain_size:
                raise UsageError(
                    f"--task-eval-size {eval_size}: task {task.key} has {task.domain_size} prompts; "
                    f"hold out between 1 and {task.domain_size - 1} (or choose a longer --task-length/--task-digits)"
                )
            chooser = Permutation(task.domain_size, key=f"{task.key}:eval")
            self.eval_items = sorted(chooser[position] for position in range(eval_size))
            self._held_out = frozenset(self.eval_items)
            self.key = f"{task.key} eval_size={eval_size} seed={seed}"
        else:
            self.eval_items = list(range(task.domain_size))
            self._held_out = frozenset()
            self.key = f"{task.key} seed={seed}"
        self._epoch_orders: dict[int, Permutation] = {}

    @property
    def domain_size(self) -> int:
        return self.task.domain_size

    @property
    def train_size(self) -> int:
        """Training prompts per epoch."""
        return self.task.domain_size - len(self._held_out)

    def item_at(self, epoch: int, position: int) -> int | None:
        """The item at ``position`` (``0 <= position < domain_size``) of training epoch ``epoch``,
        or ``None`` where that item is held out for evaluation (skip it)."""
        order = self._epoch_orders.get(epoch)
        if order is None:
            order = Permutation(self.task.domain_size, key=f"{self.task.key}:train:seed={self.seed}:epoch={epoch}")
            self._epoch_orders = {epoch: order}  # only the current epoch is kept
        item = order[position]
        return None if item in self._held_out else item
