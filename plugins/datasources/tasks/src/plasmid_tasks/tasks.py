"""The synthetic tasks: every prompt of a task is an item ``0 <= item < domain_size``.

A task maps an item to its prompt and its label, the exact answer string the ``match`` reward
compares with the decoded response. All prompts and answers but toolcalc's use only the quickstart
alphabet (digits, ``+``, ``=``, ``>``; :data:`plasmid_torch.tiny.DIGITS_ALPHABET`); toolcalc's
prompts have ``*`` and its tiny model has a tokenizer of its own (:mod:`plasmid_tasks.toolcalc`).

=========  ==================  ======================================  ===================
task       prompt              label                                   answer length
=========  ==================  ======================================  ===================
mod10      ``a+b=``            ``(a + b) % 10``, digits ``a, b``       1
reverse    ``<L digits>>``     the digits reversed                     L (``--task-length``)
digitsum   ``<L digits>=``     the sum of the digits modulo 10         1
addition   ``a+b=``            ``a + b`` zero-padded to D + 1 digits,  D + 1 (``--task-digits``)
                               with D-digit zero-padded operands
toolcalc   ``a*b=``            ``a * b`` in digits, with D-digit       2D
                               operands whose product has 2D digits
                               (317 to 999 for D = 3, D is
                               ``--task-digits``, 3 unless given)
colours    a 32x32 image and   the colour covering most of the image:  3 to 6
           a question          red, green, blue or yellow
=========  ==================  ======================================  ===================

colours' prompt is chat messages with an image part, for a vision-language model and ``--generate
vision`` (see :mod:`plasmid_tasks.colours`).

toolcalc is meant for ``--generate multiturn --tools calculator``: a model that cannot multiply
(the quickstart's tiny one) answers right only by calling the calculator and copying its answer
(see :mod:`plasmid_tasks.toolcalc`).
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass
from typing import Any, Literal

from plasmid.errors import UsageError


@dataclass(frozen=True)
class Task:
    """A family of prompts with exact answers.

    :ivar name: the ``--task`` name.
    :ivar key: the name with its parameters (``reverse(length=3)``): what identifies the prompts.
    :ivar domain_size: how many distinct prompts there are.
    :ivar answer_length: characters (tokens, with the char tokenizer) in every label.
    :ivar holds_out_eval: ``False`` when the domain is too small to hold prompts out: the eval
        split is then the whole domain (mod10), otherwise it is disjoint from training.
    """

    name: str
    key: str
    domain_size: int
    answer_length: int
    holds_out_eval: bool = True

    def example(self, item: int) -> tuple[Any, str]:
        """``(prompt, label)`` of ``item``: the prompt is text, or chat messages for a task in
        :data:`IMAGE_TASKS`."""
        raise NotImplementedError


@dataclass(frozen=True)
class Mod10(Task):
    """``a+b=`` -> ``(a+b) % 10`` for single digits; 100 prompts, item = ``10 * a + b``."""

    def example(self, item: int) -> tuple[str, str]:
        a, b = divmod(item, 10)
        return f"{a}+{b}=", str((a + b) % 10)


@dataclass(frozen=True)
class Reverse(Task):
    """``<length digits>>`` -> the digits reversed; item = the digits read as a number."""

    length: int = 3

    def example(self, item: int) -> tuple[str, str]:
        digits = f"{item:0{self.length}d}"
        return f"{digits}>", digits[::-1]


@dataclass(frozen=True)
class DigitSum(Task):
    """``<length digits>=`` -> the sum of the digits modulo 10."""

    length: int = 3

    def example(self, item: int) -> tuple[str, str]:
        digits = f"{item:0{self.length}d}"
        return f"{digits}=", str(sum(int(d) for d in digits) % 10)


@dataclass(frozen=True)
class Addition(Task):
    """``a+b=`` with ``digits``-digit zero-padded operands -> ``a+b`` zero-padded to ``digits+1``."""

    digits: int = 2

    def example(self, item: int) -> tuple[str, str]:
        a, b = divmod(item, 10**self.digits)
        return f"{a:0{self.digits}d}+{b:0{self.digits}d}=", f"{a + b:0{self.digits + 1}d}"


def toolcalc_low(digits: int) -> int:
    """The smallest toolcalc operand: the least ``low`` with ``low**2 >= 10**(2 digits - 1)``, so
    every product of two operands in ``[low, 10**digits)`` has exactly ``2 digits`` digits."""
    return math.isqrt(10 ** (2 * digits - 1) - 1) + 1


@dataclass(frozen=True)
class ToolCalc(Task):
    """``a*b=`` with ``digits``-digit operands ``toolcalc_low(digits) <= a, b < 10**digits`` (for 3
    digits 317 to 999) -> ``a*b``, always ``2 digits`` digits; item = ``(a - low) * span + (b - low)``
    with ``span = 10**digits - low``."""

    digits: int = 3

    def example(self, item: int) -> tuple[str, str]:
        low = toolcalc_low(self.digits)
        a, b = divmod(item, 10**self.digits - low)
        a, b = a + low, b + low
        return f"{a}*{b}=", str(a * b)


@dataclass(frozen=True)
class Colours(Task):
    """An image of coloured cells -> the colour covering most of it (:mod:`plasmid_tasks.colours`)."""

    def example(self, item: int) -> tuple[Any, str]:
        from plasmid_tasks.colours import example

        return example(item)


#: The ``--task`` choices.
TaskName = Literal["mod10", "reverse", "digitsum", "addition", "toolcalc", "colours"]
TASK_NAMES: tuple[str, ...] = typing.get_args(TaskName)
#: The tasks whose prompts are chat messages with images.
IMAGE_TASKS: tuple[str, ...] = ("colours",)


def make_task(name: str, length: int = 3, digits: int = 2) -> Task:
    """The task ``name`` with its parameters (``--task``, ``--task-length``, ``--task-digits``;
    ``length`` and ``digits`` are at least 1, as :class:`plasmid_tasks.options.TaskOptions`
    declares them)."""
    if name == "mod10":
        return Mod10("mod10", "mod10", domain_size=100, answer_length=1, holds_out_eval=False)
    if name in ("reverse", "digitsum"):
        key = f"{name}(length={length})"
        if name == "reverse":
            return Reverse(name, key, domain_size=10**length, answer_length=length, length=length)
        return DigitSum(name, key, domain_size=10**length, answer_length=1, length=length)
    if name == "addition":
        return Addition(name, f"addition(digits={digits})", domain_size=10 ** (2 * digits),
                        answer_length=digits + 1, digits=digits)
    if name == "toolcalc":
        return ToolCalc(name, f"toolcalc(digits={digits})", domain_size=(10**digits - toolcalc_low(digits)) ** 2,
                        answer_length=2 * digits, digits=digits)
    if name == "colours":
        from plasmid_tasks.colours import COLOURS, DOMAIN_SIZE

        return Colours(name, "colours", domain_size=DOMAIN_SIZE, answer_length=max(map(len, COLOURS)))
    raise UsageError(f"unknown --task {name!r}; choose one of {', '.join(TASK_NAMES)}")
