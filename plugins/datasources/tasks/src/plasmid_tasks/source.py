"""The ``tasks`` data source: prompt groups of a synthetic task, resumable at any prompt."""

from __future__ import annotations

from typing import Any, ClassVar

from plasmid.config import Config
from plasmid.errors import UsageError
from plasmid.groups import GroupStream, make_group
from plasmid.kernel_options import GeneralOptions, PromptOptions, RolloutOptions
from plasmid.options import Options
from plasmid.prompt_limits import PromptLimit
from plasmid.types import Group, PromptReport
from plasmid_tasks.encoding import PromptEncoder
from plasmid_tasks.options import TaskOptions
from plasmid_tasks.recipe import prepare_tiny_model
from plasmid_tasks.split import TaskSplit
from plasmid_tasks.tasks import IMAGE_TASKS
from plasmid_tasks.toolcalc import TOOLCALC_ALPHABET
from plasmid_torch.tiny import DIGITS_ALPHABET

#: Training prompts encoded and checked at start-up, besides the eval split (see ``_check_prompts``).
CHECKED_TRAIN_PROMPTS = 256


class TaskSource(GroupStream):
    """A :class:`plasmid.protocols.DataSource` over one synthetic task (see :mod:`plasmid_tasks.tasks`).

    Each sample has ``prompt`` (the task's text), ``tokens`` (the prompt's ids under ``--model``'s
    tokenizer, or the char tokenizer when there is no model), ``label`` (the exact answer string)
    and ``metadata = {"task": name}``; with ``--task-apply-chat-template`` the ids are the prompt
    as a user message in the model's chat template. A task with images (``colours``) has chat
    messages as ``prompt``, their ids with the image tokens expanded, and the images' reference
    under ``metadata[plasmid_torch.vision.VISION_KEY]`` (:class:`plasmid_torch.vision.VisionEncoder`;
    ``--model`` must be a vision-language model). Training walks the split's epochs endlessly
    (see :mod:`plasmid_tasks.split`). At construction the eval split and the first training
    prompts are encoded and checked against ``--max-prompt-length`` (:meth:`_check_prompts`).
    """

    option_classes: ClassVar[tuple[type[Options], ...]] = (TaskOptions, GeneralOptions, RolloutOptions,
                                                           PromptOptions)

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
                                    DIGITS_ALPHABET, chat=tasks.task_apply_chat_template)
        self.vision: Any = None
        if self.task.name in IMAGE_TASKS:
            from plasmid_torch.vision import VisionEncoder

            self.vision = VisionEncoder(str(general.model))
        self.checked = self._check_prompts(PromptLimit.of(config) if general.model is not None else None)

    # ------------------------------------------------------------------------------- start-up
    def _check_prompts(self, limit: PromptLimit | None) -> int:
        """Encode the eval split and the first :data:`CHECKED_TRAIN_PROMPTS` training prompts,
        each within ``limit``; how many were checked. A task's prompts all have the same number of
        characters (zero-padded operands), so these stand for the others, and one that is too long
        is an error whatever ``--overlong-prompts`` says: there is nothing to drop it for."""
        train = (self.split.item_at(0, position) for position in range(min(CHECKED_TRAIN_PROMPTS,
                                                                            self.split.domain_size)))
        items = dict.fromkeys([*self.split.eval_items, *(item for item in train if item is not None)])
        for item in items:
            prompt = self.task.example(item)[0] if self.vision is None else f"item {item}"
            try:
                length = len(self._encoded(item)[1])
            except UsageError as exc:
                raise UsageError(f"--task {self.task.key}, prompt {prompt!r}: {exc}") from None
            if limit is not None and not limit.fits(length):
                raise UsageError(f"--task {self.task.key}: the prompt {prompt!r} has {length} tokens, more than "
                                 f"{limit.describe()}; every prompt of the task is about as long, so none can be "
                                 f"dropped: lower --max-new-tokens, or use a model with a longer context")
        return len(items)

    @property
    def prompt_report(self) -> PromptReport:
        """What start-up found (:class:`~plasmid.protocols.SupportsPromptReport`): the prompts
        checked, none dropped, and whether a chat template went unused."""
        return PromptReport(data=f"--task {self.task.key}", rows=self.checked,
                            chat_template_flag=self.encode.chat_template_flag)

    # ------------------------------------------------------------------------------- training
    def next_prompt(self) -> tuple[str, list[int], str, dict[str, Any]]:
        """The next training item of the split's current epoch order (``position`` indexes the
        whole domain; eval items are skipped)."""
        return self._encoded(self._next_train_item())

    def _encoded(self, item: int) -> tuple[Any, list[int], str, dict[str, Any]]:
        """``(prompt, token ids, label, metadata)`` of ``item`` (see the class docstring)."""
        prompt, label = self.task.example(item)
        if self.vision is None:
            return prompt, self.encode(prompt), label, {"task": self.task.name}
        from plasmid_torch.vision import VISION_KEY

        ids, reference = self.vision.encode(prompt, f"item {item}")
        return prompt, ids, label, {"task": self.task.name, VISION_KEY: reference}

    def _next_train_item(self) -> int:
        while True:
            if self.position == self.split.domain_size:
                self.epoch, self.position = self.epoch + 1, 0
            item = self.split.item_at(self.epoch, self.position)
            self.position += 1
            if item is not None:
                return item

    def _group(self, item: int, *, copies: int, first_sample_index: int, group_index: int) -> Group:
        prompt, ids, label, metadata = self._encoded(item)
        return make_group(prompt, ids, label, metadata, copies=copies, first_sample_index=first_sample_index,
                          group_index=group_index)

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
