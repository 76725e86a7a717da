"""The quickstart recipe: what ``plasmid train`` needs beyond the tasks to learn on a laptop.

Applied by the plugin's ``plasmid_defaults`` when ``tasks`` is the chosen data source, before
options are checked. It fills only what the user left unset:

- ``--model``: ``<run dir>/model``, a tiny causal LM (hidden 64, 2 layers, 4 heads, FFN 256, tied
  embeddings, 64 positions; :func:`plasmid_torch.tiny.build_tiny_model` with ``--seed`` and
  ``--task-arch``) with the char tokenizer. The recipe only names it: :func:`prepare_tiny_model`
  builds it (``TaskSource.prepare``, which ``plasmid train`` calls once the run directory is
  checked), unless that directory exists (a resumed run keeps its model).
- ``--lr``: 5e-4 for that tiny model (at 3e-3 the policy's entropy collapses). Measured: on
  mod10 with 32 prompts x 8 samples, temperature 1, GRPO, AdamW (betas 0.9/0.99), grad clip 1.0,
  the mean reward reaches 0.9 after 350-415 steps. With a model of your own, ``--lr`` keeps the
  trainers' default (:class:`plasmid_torch.trainer_options.TrainerOptions`).
- ``--max-new-tokens``: the task's answer length (the answer is exactly that many characters,
  one token each with the char tokenizer; the engine also stops on ``<eos>``).

``--task toolcalc`` (:mod:`plasmid_tasks.toolcalc`) differs: ``--task-digits`` defaults to 3; the
tiny model has the toolcalc tokenizer and a short supervised warm start (``--toolcalc-warmup-steps``);
``--lr`` 1e-3 (measured: at 5e-4 the reward with tools rises about half as fast), ``--max-new-tokens``
the longest model turn (the call) and ``--max-response-tokens`` the whole right conversation
(call, tool answer, final answer); and, with any model, ``--max-turns 2`` (the call, then the
answer), ``--tool-call-format compact`` and ``--reward final-answer``.

``--task colours`` (:mod:`plasmid_tasks.colours`), prompts with an image: the tiny model is the tiny
Qwen2-VL (:func:`plasmid_torch.tiny_vision.build_tiny_vlm`, seed ``--seed``) after a warm start that
teaches the answer's form (``--colours-warmup-steps``); ``--lr`` :data:`COLOURS_LR`; and, with any
model, ``--generate vision`` (torchgen's path for images) and ``--max-new-tokens`` 7 (the longest
colour and ``<eos>``, which ends a shorter one).
"""

from __future__ import annotations

from pathlib import Path

from plasmid.config import Config
from plasmid.errors import UsageError
from plasmid.kernel_options import GeneralOptions
from plasmid_tasks.options import TaskOptions
from plasmid_tasks.split import TaskSplit
from plasmid_tasks.tasks import Task

QUICKSTART_LR = 5e-4
TOOLCALC_LR = 1e-3
TOOLCALC_DIGITS = 3
#: ``--lr`` of the colours task's tiny VLM. Measured (seed 0, 16 prompts x 8, GRPO, before the example's
#: KL term and batched generation): greedy eval accuracy 0.9 at step 69 at 1e-3, 0.76 at step 79 at
#: 2e-3 (on the earlier 4x4 grid 3e-3 lost the answer's form).
COLOURS_LR = 1e-3
#: Training items the colours warm start draws its prompts from.
WARMUP_ITEMS = 4096
#: The tiny model's shape (its FFN is 4 x hidden = 256, fixed by :func:`plasmid_torch.tiny.tiny_config`).
TINY_MODEL_SHAPE = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "max_positions": 64,
                    "tie_word_embeddings": True}


def apply_quickstart_recipe(config: Config) -> None:
    """Validate the task options and fill ``model``, ``lr`` and ``max_new_tokens`` if unset (and,
    for toolcalc, the multi-turn options and the reward; see the module docstring)."""
    if config.option.task == "toolcalc":
        config.set_default("task_digits", TOOLCALC_DIGITS)
    tasks, general = TaskOptions.of(config), GeneralOptions.of(config)
    task = tasks.build_task()
    TaskSplit(task, tasks.task_eval_size, general.seed)  # a bad --task-eval-size fails now, not at build
    if task.name == "toolcalc":
        _apply_toolcalc_recipe(config, task, tiny=general.model is None)
        return
    if task.name == "colours":
        if general.model is None:
            config.set_default("model", str(tiny_model_dir(config)))
            config.set_default("lr", COLOURS_LR)
        config.set_default("generate", "vision")
        config.set_default("max_new_tokens", task.answer_length + 1)
        return
    if general.model is None:
        _check_fits_tiny_model(task.key, len(task.example(0)[0]), task.answer_length)
        config.set_default("model", str(tiny_model_dir(config)))
        config.set_default("lr", QUICKSTART_LR)
    config.set_default("max_new_tokens", task.answer_length)


def _apply_toolcalc_recipe(config: Config, task: Task, *, tiny: bool) -> None:
    from plasmid.kernel_options import reward_weights
    from plasmid_tasks.toolcalc import conversation_positions

    prompt, turn, response = conversation_positions(task.digits)  # type: ignore[attr-defined]
    if tiny:
        needed = prompt + response
        if needed > TINY_MODEL_SHAPE["max_positions"]:
            raise UsageError(
                f"task {task.key} needs {needed} positions but the quickstart's tiny model has "
                f"{TINY_MODEL_SHAPE['max_positions']}; choose a smaller --task-digits or give --model")
        config.set_default("model", str(tiny_model_dir(config)))
        config.set_default("lr", TOOLCALC_LR)
        config.set_default("max_new_tokens", turn)
        config.set_default("max_response_tokens", response)
    config.set_default("max_turns", 2)
    config.set_default("tool_call_format", "compact")
    if config.set_default("reward", ["final-answer"]):
        config.option.reward_weights = reward_weights(config)


def tiny_model_dir(config: Config) -> Path:
    """Where the recipe's tiny model lives: ``<run dir>/model``."""
    return Path(config.run_dir) / "model"


def prepare_tiny_model(config: Config) -> None:
    """Build the tiny model that the recipe named as ``--model``, unless it is there already
    (or the user gave ``--model``). Writes only ``<run dir>/model``."""
    model_dir = tiny_model_dir(config)
    if config.is_given("model") or GeneralOptions.of(config).model != str(model_dir) or model_dir.exists():
        return
    tasks = TaskOptions.of(config)
    if tasks.task == "toolcalc":
        from plasmid_tasks.toolcalc import build_toolcalc_model

        task = tasks.build_task()
        held_out = frozenset(TaskSplit(task, tasks.task_eval_size, GeneralOptions.of(config).seed).eval_items)
        build_toolcalc_model(model_dir, seed=GeneralOptions.of(config).seed, arch=tasks.task_arch, task=task,
                             held_out=held_out, warmup_steps=tasks.toolcalc_warmup_steps, shape=TINY_MODEL_SHAPE)
        return
    if tasks.task == "colours":
        _build_colours_model(config, model_dir)
        return
    from plasmid_torch.tiny import build_tiny_model

    build_tiny_model(model_dir, seed=GeneralOptions.of(config).seed, arch=TaskOptions.of(config).task_arch,
                     **TINY_MODEL_SHAPE)


def _build_colours_model(config: Config, model_dir: Path) -> None:
    """The tiny VLM, warm-started on training items (:func:`plasmid_tasks.colours.warm_start`)."""
    import functools

    from plasmid_tasks.colours import warm_start
    from plasmid_torch.tiny_vision import build_tiny_vlm

    tasks, seed = TaskOptions.of(config), GeneralOptions.of(config).seed
    split = TaskSplit(tasks.build_task(), tasks.task_eval_size, seed)
    held_out = frozenset(split.eval_items)
    items = [item for item in range(4 * WARMUP_ITEMS) if item not in held_out][:WARMUP_ITEMS]
    steps = tasks.colours_warmup_steps
    build_tiny_vlm(model_dir, seed=seed,
                   warm_start=functools.partial(warm_start, items=items, steps=steps, seed=seed) if steps else None)


def _check_fits_tiny_model(task_key: str, prompt_chars: int, answer_length: int) -> None:
    needed = 1 + prompt_chars + answer_length + 1  # <bos>, prompt, answer, <eos>
    if needed > TINY_MODEL_SHAPE["max_positions"]:
        raise UsageError(
            f"task {task_key} needs {needed} positions but the quickstart's tiny model has "
            f"{TINY_MODEL_SHAPE['max_positions']}; choose a shorter --task-length/--task-digits or give --model"
        )
