"""The options of plasmid-tasks, declared once: flags, help, checks and typed values."""

from __future__ import annotations

from typing import Literal

from plasmid.options import Options, option
from plasmid_tasks.colours import WARMUP_STEPS as COLOURS_WARMUP_STEPS
from plasmid_tasks.tasks import Task, TaskName, make_task
from plasmid_tasks.toolcalc import WARMUP_STEPS


class TaskOptions(Options, group="tasks", description="built-in synthetic tasks (--datasource tasks, the quickstart)"):
    task: TaskName = option("mod10", "which task")
    task_length: int = option(3, "digits in a reverse/digitsum prompt", min=1)
    task_digits: int = option(2, "digits of each addition or toolcalc operand", min=1,
                              default_text="2; 3 with --task toolcalc")
    task_eval_size: int = option(200, "prompts held out for evaluation (all tasks but mod10, whose eval split is "
                                      "all 100)", min=1)
    toolcalc_warmup_steps: int = option(WARMUP_STEPS, "--task toolcalc: supervised steps on demonstrations of the tool "
                                            "call when the recipe builds the tiny model (0: none; RL alone never "
                                            "finds the call)", min=0)
    colours_warmup_steps: int = option(COLOURS_WARMUP_STEPS, "--task colours: supervised steps teaching the answer's "
                                            "form (a colour word, drawn at random) when the recipe builds the tiny "
                                            "vision-language model (0: none)", min=0)
    task_apply_chat_template: bool = option(False, "encode each prompt as a user message with --model's chat "
                                                   "template and its generation prompt (for instruct models)")
    task_arch: Literal["qwen2", "llama"] = option("qwen2", "architecture of the tiny model built when --model is "
                                                           "not given")

    def build_task(self) -> Task:
        """The task chosen by ``--task``, ``--task-length`` and ``--task-digits``."""
        return make_task(self.task, length=self.task_length, digits=self.task_digits)
