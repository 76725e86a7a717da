"""``--task toolcalc``: multiplication that the quickstart's tiny model can do only with the calculator.

The conversation a right answer takes (``--generate multiturn --tools calculator
--tool-call-format compact``, which the recipe defaults to), for ``417*356=``::

    prompt (data source)   <bos> 4 1 7 * 3 5 6 =
    model turn 1           <call> 4 1 7 * 3 5 6 </call>          (</call> ends the turn)
    tool (loss_mask 0)     <result> 1 4 8 4 5 2 </result>
    model turn 2           1 4 8 4 5 2 <eos>

The reward :class:`FinalAnswer` (``--reward final-answer``, the recipe's default for toolcalc) is
1.0 when the text after the last tool answer equals the label exactly. Without tools the call is
answered with an error, so the model must multiply two 3-digit numbers itself, which a 2-layer,
64-wide model does not learn in a few hundred steps.

The tiny model's tokenizer (:func:`toolcalc_tokenizer`): one token per printable ASCII character
(the quickstart alphabet first, then ``*``, so prompt ids are the quickstart's where they share
characters; letters and punctuation so that a tool's error message can be spelled) and the four
tags of the compact format as single tokens. The quickstart's tokenizer is untouched.

A random model never writes a right call by chance (8 specific tokens, then 6 more to copy), so
RL alone has nothing to reinforce (measured: after a warm start that taught the call but left
every final answer wrong, reward 0.000 over 60 RL steps). When the recipe builds the model it gives it a short
warm start (:func:`warm_start`, ``--toolcalc-warmup-steps``, 300 by default, about 15 CPU-seconds):
supervised steps on demonstrations from training items only, the loss on the model's tokens only,
half of which call the calculator and half of which answer at once (:data:`WARMUP_CALL_FRACTION`).
So the model starts out calling on about half of the prompts, with inexact copies, and RL learns
that calling pays (with the calculator) and to copy exactly. Measured (seed 0, 16 prompts x 8
samples): reward 0.46 at step 0, 0.8-0.88 from step 6 on, tool calls 0.52 -> 0.98 per sample;
without tools 0.000 throughout. Other seeds start from 0.16-0.63 (the warm start's copies differ).
"""

from __future__ import annotations

import random
import string
from pathlib import Path
from typing import Any, ClassVar

from plasmid.config import Config
from plasmid.options import Options
from plasmid.types import Sample
from plasmid_tasks.warmstart import Extra, Row, supervised_steps
from plasmid_torch.tiny import DIGITS_ALPHABET, EOS_ID, PAD_ID

#: The compact tool-call format's tags (``plasmid_multiturn.formats.Compact``; the same strings).
CALL_OPEN, CALL_CLOSE, RESULT_OPEN, RESULT_CLOSE = "<call>", "</call>", "<result>", "</result>"
TAGS = (CALL_OPEN, CALL_CLOSE, RESULT_OPEN, RESULT_CLOSE)
#: Closing tags after which a tool's answer ends (compact and tagged formats): the final answer follows the last.
TOOL_ANSWER_ENDS = (RESULT_CLOSE, "</tool_response>")
#: The toolcalc tokenizer's characters: the quickstart alphabet, ``*``, then the rest of printable ASCII.
TOOLCALC_ALPHABET = DIGITS_ALPHABET + "*" + "".join(
    char for char in string.printable[:95] if char not in DIGITS_ALPHABET + "*")
#: ``--toolcalc-warmup-steps``'s default, and the warm start's learning rate and batch.
WARMUP_STEPS, WARMUP_LR, WARMUP_BATCH = 300, 3e-3, 32
#: The share of warm-start demonstrations that call the calculator (the others answer at once).
WARMUP_CALL_FRACTION = 0.5


def toolcalc_tokenizer() -> Any:
    """The char tokenizer of :data:`TOOLCALC_ALPHABET` with :data:`TAGS` added as single tokens."""
    from plasmid_torch.tiny import char_tokenizer

    tokenizer = char_tokenizer(TOOLCALC_ALPHABET)
    tokenizer.add_tokens(list(TAGS))
    return tokenizer


def demonstration(prompt: str, label: str, call: bool = True) -> tuple[list[str | int], list[int]]:
    """A right conversation after ``prompt`` as pieces (text, or a token id) and, per piece,
    whether the model says it (1) or the prompt/tool does (0): with ``call``, the calculator is
    called and its answer copied; without, the answer is given at once."""
    if not call:
        return [prompt, label, EOS_ID], [0, 1, 1]
    expression = prompt.rstrip("=")
    pieces: list[str | int] = [prompt, CALL_OPEN + expression + CALL_CLOSE, RESULT_OPEN + label + RESULT_CLOSE,
                               label, EOS_ID]
    return pieces, [0, 1, 0, 1, 1]


def conversation_positions(digits: int) -> tuple[int, int, int]:
    """``(prompt, longest model turn, whole response)`` in tokens for ``digits``-digit operands
    with the toolcalc tokenizer: the prompt is ``<bos>`` and ``2 digits + 2`` characters, the call
    turn ``2 digits + 3`` tokens, the tool answer ``2 digits + 2`` and the final turn ``2 digits + 1``."""
    return 2 * digits + 3, 2 * digits + 3, 6 * digits + 6


def build_toolcalc_model(directory: Path, *, seed: int, arch: str, task: Any, held_out: frozenset[int],
                         warmup_steps: int, shape: dict[str, Any]) -> Path:
    """The tiny model of ``shape`` with :func:`toolcalc_tokenizer`, initialised with ``seed``,
    warm-started for ``warmup_steps`` (:func:`warm_start`) on training items of ``task`` (never
    those in ``held_out``), saved to ``directory`` (through a temporary sibling, renamed)."""
    import torch
    import transformers

    from plasmid_torch.tiny import save_model_dir, tiny_config

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    tokenizer = toolcalc_tokenizer()
    config = tiny_config(len(tokenizer), arch=arch, **shape)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    warm_start(model, tokenizer, task, held_out, steps=warmup_steps, seed=seed)
    return save_model_dir(model, tokenizer, directory)


def warm_start(model: Any, tokenizer: Any, task: Any, held_out: frozenset[int], *, steps: int, seed: int,
               lr: float = WARMUP_LR, batch_size: int = WARMUP_BATCH,
               call_fraction: float = WARMUP_CALL_FRACTION) -> list[float]:
    """``steps`` AdamW steps (constant ``lr``) of next-token cross-entropy on
    :func:`demonstration` conversations of random training items (``held_out`` excluded; a share
    ``call_fraction`` of them call the calculator), on the model's tokens only. Deterministic
    for a ``seed``. :returns: the loss of each step."""
    rng = random.Random(f"toolcalc-warmup:{seed}")

    def next_batch() -> tuple[list[Row], Extra]:
        rows = []
        while len(rows) < batch_size:
            item = rng.randrange(task.domain_size)
            if item not in held_out:
                rows.append(_demonstration_ids(tokenizer, *task.example(item), call=rng.random() < call_fraction))
        return rows, None

    return supervised_steps(model, next_batch, steps=steps, lr=lr, pad_id=PAD_ID)


def _demonstration_ids(tokenizer: Any, prompt: str, label: str, call: bool) -> tuple[list[int], list[int]]:
    """Token ids of the demonstration and its labels (-100 where the model does not speak)."""
    ids: list[int] = []
    targets: list[int] = []
    for piece, spoken in zip(*demonstration(prompt, label, call), strict=True):
        if isinstance(piece, int):
            piece_ids = [piece]
        else:
            piece_ids = list(tokenizer.encode(piece, add_special_tokens=not ids))
        ids += piece_ids
        targets += piece_ids if spoken else [-100] * len(piece_ids)
    return ids, targets


def final_answer(response: str) -> str:
    """The text after the last tool answer (:data:`TOOL_ANSWER_ENDS`) in ``response``, or all of
    it when no tool answered, stripped of surrounding blanks."""
    cut = max((response.rfind(end) + len(end) for end in TOOL_ANSWER_ENDS if end in response), default=0)
    return response[cut:].strip()


class FinalAnswer:
    """Reward ``final-answer``: 1.0 when :func:`final_answer` of the response equals the label
    (a string, or a list of acceptable strings), else 0.0. Stateless."""

    option_classes: ClassVar[tuple[type[Options], ...]] = ()

    def __init__(self, config: Config) -> None:
        """Built once per run; reads no option."""

    async def __call__(self, sample: Sample) -> float:
        label = sample.label
        if label is None:
            raise ValueError(f"reward 'final-answer' (plasmid-tasks) got sample {sample.index} without a label")
        answers = [str(answer) for answer in (label if isinstance(label, list | tuple) else [label])]
        return 1.0 if final_answer(sample.response) in {answer.strip() for answer in answers} else 0.0
