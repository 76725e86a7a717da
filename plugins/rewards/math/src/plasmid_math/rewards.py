"""The ``math`` and ``math-format`` rewards.

``math``: 1.0 when the response's final answer (:func:`plasmid_math.extract.final_answer`) is
equivalent (:func:`plasmid_math.equivalence.equivalent`) to one of the label's answers, else 0.0.

``math-format``: the ``math`` score, minus ``--math-format-penalty`` when the response has no
*explicit* final answer (``\\boxed{}`` or "the answer is ..."; a last number found in passing
does not count): so with the default penalty 1.0, a correct answer stated explicitly scores 1,
a wrong one 0, an unstated correct one 0, and an unstated wrong one -1.

With ``--math-think-tag`` only the text after the last ``</think>`` (or the given tag) is graded;
a response without it has no answer (and ``math-format`` applies the penalty).

The label is a string (an answer, or a worked solution whose ``\\boxed{}`` holds the answer), a
number (a float one compares as a float: :func:`label_text`), or a list of acceptable answers.
Grading runs in a worker thread (``asyncio.to_thread``), so the event loop is never blocked, and
symbolic checks run in sympy worker processes with one time limit for all the checks of one
response (``--math-symbolic-timeout``; see :mod:`plasmid_math.symbolic`). Every parse is bounded
before it starts (:mod:`plasmid_math.bounds`).
"""

from __future__ import annotations

import asyncio
import math
import numbers
from typing import Any, ClassVar

from plasmid.config import Config
from plasmid.options import Options
from plasmid.types import Sample
from plasmid_math.equivalence import equivalent
from plasmid_math.extract import FinalAnswer, final_answer, last_boxed
from plasmid_math.options import MathOptions
from plasmid_math.symbolic import SymbolicChecker


class MissingLabelError(ValueError):
    """A sample reached a math reward without a usable label."""


def label_text(answer: str | numbers.Number) -> str:
    """One label answer as text: a string as it is (its ``\\boxed{}`` if it has one); a float as
    a float (exponent form, so it compares within ``--math-tolerance``: 0.1 as a float is not
    exactly 1/10), unless it is an integer of magnitude at most 2**53 (3.0 is 3, as datasets store integers as
    floats); any other number (int, Fraction, Decimal) exactly."""
    if isinstance(answer, float):
        if answer.is_integer() and abs(answer) <= 2**53:  # an integer, exactly
            return str(int(answer))
        return f"{answer!r}e0" if math.isfinite(answer) and "e" not in repr(answer) else repr(answer)
    text = str(answer)
    boxed = last_boxed(text)
    return boxed if boxed is not None else text


def reference_answers(label: Any, where: str) -> list[str]:
    """The label as a non-empty list of answer strings (:func:`label_text`)."""
    if label is None:
        raise MissingLabelError(f"{where} has no label; math rewards compare with the label's answer "
                                f"(file data sources: --label-key FIELD)")
    answers = list(label) if isinstance(label, (list, tuple)) else [label]
    if not answers:
        raise MissingLabelError(f"{where} has an empty list as its label; give at least one answer")
    texts = []
    for answer in answers:
        if isinstance(answer, bool) or not isinstance(answer, (str, numbers.Number)):
            raise TypeError(f"{where}: a label answer is {type(answer).__name__} {answer!r}; labels are strings, "
                            f"numbers, or lists of them")
        texts.append(label_text(answer))
    return texts


class MathReward:
    """``math``: see the module docstring. Thread-safe and stateless apart from the sympy workers."""

    name = "math"
    option_classes: ClassVar[tuple[type[Options], ...]] = (MathOptions,)

    def __init__(self, config: Config) -> None:
        self.options = options = MathOptions.of(config)
        self.think_tag = options.math_think_tag
        self.tolerance = options.math_tolerance
        self.symbolic = SymbolicChecker(timeout=options.math_symbolic_timeout, workers=options.math_symbolic_workers,
                                        tolerance=self.tolerance)

    def grade(self, response: str, label: Any, where: str = "sample") -> tuple[float, FinalAnswer | None]:
        """``(1.0 or 0.0, the final answer found)`` for ``response`` against ``label`` (blocking)."""
        references = reference_answers(label, f"reward '{self.name}' (plasmid-math), {where}")
        found = final_answer(response, self.think_tag)
        if found is None:
            return 0.0, None
        symbolic = self.symbolic.budget()  # --math-symbolic-timeout for all of this response's checks
        correct = any(equivalent(found.text, reference, symbolic, self.tolerance) for reference in references)
        return (1.0 if correct else 0.0), found

    def score(self, response: str, label: Any, where: str = "sample") -> float:
        return self.grade(response, label, where)[0]

    async def __call__(self, sample: Sample) -> float:
        return await asyncio.to_thread(self.score, sample.response, sample.label, f"sample {sample.index}")


class MathFormatReward(MathReward):
    """``math-format``: the ``math`` score minus ``--math-format-penalty`` without an explicit answer."""

    name = "math-format"

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.penalty = self.options.math_format_penalty

    def score(self, response: str, label: Any, where: str = "sample") -> float:
        value, found = self.grade(response, label, where)
        return value if found is not None and found.explicit else value - self.penalty
