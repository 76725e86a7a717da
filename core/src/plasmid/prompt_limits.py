"""Which prompts fit the model's context: ``--max-prompt-length`` and ``--overlong-prompts``, one
rule that every data source applies to its rows at start-up, before the run directory is written.

A prompt of ``P`` tokens fits when ``P <= --max-prompt-length``. By default the limit is the
model's context (:mod:`plasmid.model_limits`) minus ``--max-new-tokens``, so a prompt that fits
leaves room for a whole response: ``P + max_new_tokens <= context``, which is what the engines
check of every request (they refuse one past the context, :class:`~plasmid.errors.ContextLengthError`).
A limit given above that, or a ``--max-new-tokens`` that leaves no room for any prompt, is a usage
error; a model whose directory names no context has no default limit.

A prompt that does not fit is, with ``--overlong-prompts drop`` (the default), dropped and
counted (:class:`PromptScreen`); ``plasmid train`` prints one line saying how many of how many,
and logs ``data/dropped_overlong`` with its first step (:func:`report_prompts`). With ``error``
the first one stops the run: one line naming its file and row, its length and the limit.
:func:`report_prompts` also prints the chat-template warning: a ``--model`` whose tokenizer has a
chat template (an instruct model) given prompts encoded as plain text.

How a data source takes part: build a :class:`PromptScreen` with :meth:`PromptLimit.of`, call
:meth:`PromptScreen.keep` on each encoded row (:meth:`PromptScreen.kept` on a whole split), and
expose the result as ``prompt_report`` (a
:class:`~plasmid.types.PromptReport`; :class:`~plasmid.protocols.SupportsPromptReport`).
:class:`plasmid.records.RecordStream` does all of it for the sources over prompt files.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO, TypeVar

from plasmid.errors import UsageError
from plasmid.kernel_options import GeneralOptions, PromptOptions, RolloutOptions
from plasmid.model_limits import ModelLimits, read_model_limits
from plasmid.options import HoldsOptions
from plasmid.protocols import SupportsPromptReport
from plasmid.types import PromptReport

T = TypeVar("T")

#: The metric of the prompts dropped at start-up, logged with the run's first step.
DROPPED_METRIC = "data/dropped_overlong"


@dataclass(frozen=True)
class PromptLimit:
    """The longest prompt a run keeps, and what happens to longer ones (:meth:`of` builds it).

    :ivar max_prompt_length: the limit in tokens, ``None`` for none.
    :ivar derived: the limit is the default (context minus ``--max-new-tokens``), not given.
    """

    max_prompt_length: int | None
    overlong: str = "drop"
    max_new_tokens: int = 0
    model: ModelLimits | None = None
    derived: bool = False

    @classmethod
    def of(cls, config: HoldsOptions) -> PromptLimit:
        """The run's limit: ``--max-prompt-length`` or its default, checked against ``--model``'s
        context when the directory exists (:class:`UsageError`, one line: a ``--max-new-tokens``
        that leaves no room for a prompt, a ``--max-prompt-length`` above the room left)."""
        options, new_tokens = PromptOptions.of(config), RolloutOptions.of(config).max_new_tokens
        model = GeneralOptions.of(config).model
        limits = read_model_limits(model) if model and Path(model).is_dir() else None
        if limits is None or limits.context is None:
            return cls(options.max_prompt_length, options.overlong_prompts, new_tokens, limits)
        room = limits.context - new_tokens
        if room < 1:
            raise UsageError(f"--max-new-tokens {new_tokens}: {limits.describe()}, so a response of {new_tokens} "
                             f"tokens leaves no room for a prompt; lower --max-new-tokens (at most "
                             f"{limits.context - 1})")
        given = options.max_prompt_length
        if given is not None and given > room:
            raise UsageError(f"--max-prompt-length {given}: a prompt of {given} tokens and a response of "
                             f"--max-new-tokens {new_tokens} need {given + new_tokens} positions, but "
                             f"{limits.describe()}; give at most {room}, or lower --max-new-tokens")
        return cls(given or room, options.overlong_prompts, new_tokens, limits, derived=given is None)

    def fits(self, length: int) -> bool:
        return self.max_prompt_length is None or length <= self.max_prompt_length

    def describe(self) -> str:
        """``--max-prompt-length N`` with where ``N`` came from, for messages; ``""`` without a limit."""
        if self.max_prompt_length is None:
            return ""
        if self.derived and self.model is not None:
            return (f"--max-prompt-length {self.max_prompt_length} (the model's context of {self.model.context} "
                    f"tokens minus --max-new-tokens {self.max_new_tokens})")
        return f"--max-prompt-length {self.max_prompt_length}"

    def refusal(self, location: str, length: int) -> UsageError:
        """The ``--overlong-prompts error`` message of a prompt of ``length`` tokens at ``location``."""
        return UsageError(f"{location}: the prompt has {length} tokens, more than {self.describe()}; shorten or "
                          f"remove the row, or skip such rows with --overlong-prompts drop")


@dataclass
class PromptScreen:
    """Applies a :class:`PromptLimit` to a data source's rows, counting what it read and dropped."""

    limit: PromptLimit
    rows: int = 0
    dropped: int = 0
    first_dropped: str = field(default="", repr=False)

    def keep(self, location: str, length: int) -> bool:
        """Whether the row at ``location``, whose prompt has ``length`` tokens, is kept; with
        ``--overlong-prompts error`` a prompt that does not fit raises (:meth:`PromptLimit.refusal`)."""
        self.rows += 1
        if self.limit.fits(length):
            return True
        if self.limit.overlong == "error":
            raise self.limit.refusal(location, length)
        self.dropped += 1
        self.first_dropped = self.first_dropped or f"{location}, {length} tokens"
        return False

    def kept(self, items: Sequence[T], measure: Callable[[T], tuple[str, int]], data: str) -> list[T]:
        """The ``items`` whose prompt fits, in order (:meth:`keep` on each; ``measure(item)`` gives
        its location and prompt length); :meth:`nothing_left` when there were some and none fit."""
        kept = [item for item in items if self.keep(*measure(item))]
        if items and not kept:
            raise self.nothing_left(data, len(items))
        return kept

    def first_fitting(self, draw: Callable[[], T], measure: Callable[[T], tuple[str, int]], data: str,
                      size: int) -> T:
        """The next of ``draw()``'s items whose prompt fits (:meth:`keep` on each), for a source
        that makes its training items on demand and screens them as they are drawn (generating a
        whole split up front can take a minute); :meth:`nothing_left` after ``size`` in a row."""
        for _ in range(size):
            item = draw()
            if self.keep(*measure(item)):
                return item
        raise self.nothing_left(data, size)

    def report(self, data: str, chat_template_flag: str = "") -> PromptReport:
        """What the screen saw, as the data source reports it (``prompt_report``)."""
        return PromptReport(data=data, rows=self.rows, dropped_overlong=self.dropped, limit=self.limit.describe(),
                            first_dropped=self.first_dropped, chat_template_flag=chat_template_flag)

    def nothing_left(self, data: str, rows: int) -> UsageError:
        """The error for a split whose ``rows`` prompts were all dropped."""
        return UsageError(f"{data}: every one of its {rows} prompt(s) is longer than {self.limit.describe()} "
                          f"(the first: {self.first_dropped}); shorten them, lower --max-new-tokens, or use a "
                          f"model with a longer context")


def report_prompts(config: Any, data_source: object, stream: TextIO | None = None) -> dict[str, float]:
    """Say at start-up what ``data_source`` found in its prompts (when it reports them,
    :class:`~plasmid.protocols.SupportsPromptReport`) and return the metrics to log once:

    - prompts dropped as too long: one line (how many of how many, the limit, the first one);
      and, when a limit was applied, ``{"data/dropped_overlong": N}`` (0 included);
    - prompts encoded as plain text for a ``--model`` (given by the user, not a recipe's) whose
      tokenizer has a chat template: one warning line naming the flag that applies it.
    """
    if not isinstance(data_source, SupportsPromptReport):
        return {}
    report, out = data_source.prompt_report, stream or sys.stderr
    if report.dropped_overlong:
        out.write(f"plasmid: dropped {report.dropped_overlong} of {report.rows} prompts of {report.data}: longer "
                  f"than {report.limit} (the first: {report.first_dropped}); --overlong-prompts error refuses them "
                  f"instead\n")
    if report.chat_template_flag and config.is_given("model"):
        out.write(f"plasmid: warning: the tokenizer of --model {GeneralOptions.of(config).model} has a chat "
                  f"template (an instruct model?), but the prompts of {report.data} are encoded as plain text; add "
                  f"{report.chat_template_flag} to encode each as a user message with the template's generation "
                  f"prompt (plain text is kept if you leave it out)\n")
    out.flush()
    return {DROPPED_METRIC: float(report.dropped_overlong)} if report.limit else {}
