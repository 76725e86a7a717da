"""``--generate multiturn``: the model talks, calls tools, reads their answers, and talks again.

Token in, token out. A finished sample's ``tokens`` are exactly, in order:

1. the prompt's token ids (the data source's for ``tagged``; the chat template's rendering of the
   prompt messages with the tools for ``chat-template``);
2. for each model turn, the ids the engine generated (``loss_mask`` 1, the engine's log-probs
   in ``rollout_logprobs``);
3. after a turn that ends in a tool call, the ids of the text the format appends (the tool's
   answer and what surrounds it; ``loss_mask`` 0, log-prob 0.0), then the next model turn.

Nothing is decoded and encoded again: each turn's prompt to the engine is the previous prompt plus
the tokens appended since (a prefix-extension), and only the appended text is ever encoded. A
turn ends at EOS (or another stop token) or at ``--max-new-tokens``. Its calls are every complete
call in it, in order, up to one whose syntax closes the turn's calls (a Mistral ``[TOOL_CALLS]``
list, DeepSeek's calls block, harmony's ``<|call|>``; see
:attr:`plasmid_serving.parsers.CallSpan.final`): several ``<tool_call>`` blocks, Llama's
``{...}; {...}``, several Mistral ``[TOOL_CALLS]NAME[ARGS]{...}``. **Tokens the engine generated
after the turn's last call are cut** (they are not in the sample, and not trained on: its end of
turn token, anything it made up past the call), so the model's turn ends at its calls. Every
call is run, one after the other, in order, and all the answers are appended together as the
format answers several calls (each counts as a tool call in the metrics). A format whose closing
tag is one token of the tokenizer (``tagged`` and ``chat-template``: ``</tool_call>``) makes it a
stop token, so there the engine ends the turn at its first call. How calls are read is the
format's own syntax, or ``--tool-parser NAME`` of the shared parser family
(:mod:`plasmid_serving.parsers`), after ``--reasoning-parser NAME`` splits off the reasoning (a call
inside the reasoning is not run): parsing reads the text, and the tokens stay the engine's.

The conversation ends when a turn has no tool call (status: the engine's, ``COMPLETED`` or
``TRUNCATED``), when the model calls a tool in turn ``--max-turns`` (the call is not run;
``TRUNCATED``), or when the response (every turn and tool answer together) reaches
``--max-response-tokens`` (a tool answer that does not fit is cut to fit; ``TRUNCATED``), or when
the engine refuses a later turn as longer than the model's context
(:class:`~plasmid.errors.ContextLengthError`; ``TRUNCATED``, the tokens so far kept). With the
``chat-template`` format, a template that would rewrite the history, or that raises while
rendering a tool turn, ends the conversation too (``COMPLETED``, the reason in
``sample.metadata["multiturn"]["mismatch"]``, counted in ``rollout/template_mismatch_fraction``);
the tokens are never re-tokenised to fit it, and the rollout goes on.

Tools (``ctx.tools``) never crash a rollout: an unparsable call, an unknown tool, a tool that
raises (:class:`~plasmid.protocols.ToolError` or anything else), one that runs past
``--tool-timeout`` or answers with more than ``--tool-max-output-chars`` characters (cut, with a
note) or with something other than text, is answered with a one-line ``error: ...`` text, and
counted as a tool error. Cancelling the rollout (the driver's abort grace) cancels a running call.

Per sample, ``sample.metadata["rollout_metrics"]`` holds ``turns_mean``, ``tool_calls_mean``,
``tool_errors_mean``, ``tool_seconds_mean`` and ``truncated_fraction`` (1.0 when ``TRUNCATED``),
which the rollout driver averages into ``rollout/<name>``; ``sample.metadata["multiturn"]`` holds
the conversation's state (:class:`plasmid_multiturn.formats.Conversation`).

Partial rollouts: a sample the driver aborted mid-turn (``ABORTED`` with a response) is continued
from its tokens and its saved state; with ``--mask-offpolicy-in-partial-rollout`` the tokens
generated before get ``loss_mask`` 0. Aborts follow :class:`~plasmid.protocols.GenerateFn`'s
contract: once ``ctx.aborting`` is set, no new turn is started, and a tool call that is running
is cancelled at once; the sample is returned ``ABORTED`` as it stands (the turn ends at its call,
the call not counted), and when resumed the call is run again and the conversation goes on. A
rollout cancelled outright (the driver's grace period ran out) cancels a running call too.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Coroutine
from dataclasses import replace
from typing import Any, ClassVar, TypeVar

from plasmid.config import Config
from plasmid.errors import ContextLengthError, UsageError
from plasmid.kernel_options import ScheduleOptions
from plasmid.options import Options
from plasmid.protocols import RolloutView, Tokenizer, ToolError
from plasmid.types import Sample, SamplingParams, Status
from plasmid_multiturn.formats import (
    FORMATS,
    Compact,
    Conversation,
    FoundCall,
    TemplateMismatch,
    ToolCallFormat,
    spellable,
    tool_schemas,
)
from plasmid_multiturn.options import MultiTurnOptions
from plasmid_serving.parsers.options import ParserOptions

T = TypeVar("T")

#: Keys of ``sample.metadata`` this generate function writes.
STATE_KEY, METRICS_KEY = "multiturn", "rollout_metrics"


def find_call_in_tokens(fmt: ToolCallFormat, tokenizer: Tokenizer, ids: list[int],
                        tools: list[dict[str, Any]] | None = None) -> tuple[int, FoundCall] | None:
    """``(k, call)``: the tool calls of the turn whose tokens are ``ids`` (``call`` and its
    siblings, :meth:`~plasmid_multiturn.formats.ToolCallFormat.find_call`) and the fewest leading
    tokens ``ids[:k]`` whose text holds them all, through the end of the last (the turn is cut
    there), or ``None``. ``tools``: the tools offered, as OpenAI specs (a parser may type values by
    their schemas)."""
    if not ids:
        return None
    whole = fmt.find_call(tokenizer.decode(ids, skip_special_tokens=False), tools)
    if whole is None:
        return None
    count = len(whole.all)

    def holds(k: int) -> FoundCall | None:
        found = fmt.find_call(tokenizer.decode(ids[:k], skip_special_tokens=False), tools)
        return found if found is not None and len(found.all) >= count and found.end >= whole.end else None

    low, high = 1, len(ids)  # the smallest k whose prefix holds every call (monotone in k)
    while low < high:
        middle = (low + high) // 2
        if holds(middle) is None:
            low = middle + 1
        else:
            high = middle
    call = holds(low)
    assert call is not None
    return low, call


def make_format(name: str, parsers: ParserOptions) -> ToolCallFormat:
    """The ``--tool-call-format`` ``name``, reading calls with ``--tool-parser`` (else its own
    syntax) after ``--reasoning-parser`` (else no reasoning).

    :raises UsageError: a parser option with ``compact``, which reads only its own syntax.
    """
    cls = FORMATS[name]
    if cls is Compact:
        if parsers.tool_parser is not None or parsers.reasoning_parser is not None:
            raise UsageError("--tool-call-format compact reads only its own <call>...</call> syntax: drop "
                             "--tool-parser and --reasoning-parser, or choose tagged, chat-template or mistral")
        return Compact()
    return cls(parsers.tool(), parsers.reasoning())


class MultiTurn:
    """Provider ``multiturn`` of ``plasmid_generate_fns``; see the module docstring."""

    #: It calls the run's ``--tools`` (start-up refuses ``--tools`` with a generate function that does not).
    takes_tools: ClassVar[bool] = True
    option_classes: ClassVar[tuple[type[Options], ...]] = (MultiTurnOptions, ScheduleOptions, ParserOptions)

    def __init__(self, config: Config) -> None:
        options = MultiTurnOptions.of(config)
        self.options = options
        self.format: ToolCallFormat = make_format(options.tool_call_format, ParserOptions.of(config))
        self.mask_offpolicy = ScheduleOptions.of(config).mask_offpolicy_in_partial_rollout

    async def __call__(self, ctx: RolloutView, sample: Sample, params: SamplingParams) -> Sample:
        if sample.status in (Status.COMPLETED, Status.TRUNCATED):
            return sample
        tokenizer, fmt = ctx.tokenizer, self.format
        budget = self.options.budget(params.max_new_tokens)
        resumed = (sample.status == Status.ABORTED and sample.response_length > 0
                   and isinstance(sample.metadata.get(STATE_KEY), dict))
        if resumed:
            conversation = Conversation.from_dict(sample.metadata[STATE_KEY])
            prompt = sample.prompt_tokens
            response = sample.response_tokens
            logprobs = list(sample.rollout_logprobs or [0.0] * len(response))
            mask = [0] * len(response) if self.mask_offpolicy else list(sample.loss_mask or [1] * len(response))
        else:
            conversation = Conversation()
            prompt = fmt.prompt_ids(tokenizer, sample, ctx.tools, conversation)
            response, logprobs, mask = [], [], []
        stops = tuple(dict.fromkeys((*params.stop_token_ids, *fmt.stop_token_ids(tokenizer))))
        schemas = tool_schemas(ctx.tools)
        weight_version = sample.weight_version
        in_turn = resumed  # a resumed sample continues the turn it was aborted in
        status = Status.COMPLETED
        while True:
            if not in_turn:
                conversation.turns += 1
                conversation.turn_start = len(response)
            so_far = response[conversation.turn_start:]
            if ctx.aborting.is_set():  # the step is being aborted: no new engine request, no tool call
                status = Status.ABORTED
                break
            # a resumed turn may already hold its call (aborted right after it): then run the tool
            found = find_call_in_tokens(fmt, tokenizer, so_far, schemas) if in_turn else None
            in_turn = False
            if found is None:
                room = min(budget - len(response), params.max_new_tokens - len(so_far))
                if room <= 0:
                    status = Status.TRUNCATED
                    break
                seed = None if params.seed is None else params.seed + conversation.turns - 1
                try:
                    output = await ctx.engine_for(sample).generate(
                        prompt + response, replace(params, max_new_tokens=room, stop_token_ids=stops, seed=seed))
                except ContextLengthError:
                    if not response:  # the prompt's own turn: start-up lets no such prompt through
                        raise
                    status = Status.TRUNCATED  # the conversation has outgrown the model's context
                    break
                weight_version = output.weight_version
                ids, new_logprobs = list(output.token_ids), list(output.logprobs)
                found = find_call_in_tokens(fmt, tokenizer, so_far + ids, schemas)
                if found is not None:  # the turn ends at the call: what came after it is cut
                    keep = max(found[0] - len(so_far), 0)
                    ids, new_logprobs = ids[:keep], new_logprobs[:keep]
                response += ids
                logprobs += new_logprobs
                mask += [1] * len(ids)
                if output.status == Status.ABORTED:
                    status = Status.ABORTED
                    break
                if found is None:
                    status = output.status
                    break
            if conversation.turns >= self.options.max_turns or len(response) >= budget:
                status = Status.TRUNCATED
                break
            calls = found[1].all  # one call, or several in one turn (in order)
            ran = await until_aborted(ctx, self.run_tools(ctx, calls, sample))
            if ran is None:  # aborted mid-call: the turn ends at its call(s), which run again when resumed
                status = Status.ABORTED
                break
            answers = []
            for answer, failed, seconds in ran:
                conversation.tool_calls += 1
                conversation.tool_errors += int(failed)
                conversation.tool_seconds += seconds
                answers.append(spellable(tokenizer, answer))  # every format: a tool's text never crashes it
            turn_text = tokenizer.decode(response[conversation.turn_start:], skip_special_tokens=False)
            try:
                text = fmt.tool_turn(tokenizer, conversation, turn_text, calls, answers, ctx.tools)
            except TemplateMismatch as mismatch:
                conversation.mismatch = str(mismatch)
                status = Status.COMPLETED
                break
            appended = list(tokenizer.encode(text, add_special_tokens=False))
            fits = appended[:budget - len(response)]
            response += fits
            logprobs += [0.0] * len(fits)
            mask += [0] * len(fits)
            if len(fits) < len(appended) or len(response) >= budget:
                status = Status.TRUNCATED
                break
        sample.tokens = prompt + response
        sample.response_length = len(response)
        sample.response = tokenizer.decode(response, skip_special_tokens=True)
        sample.loss_mask = mask
        sample.rollout_logprobs = logprobs
        sample.status = status
        sample.weight_version = weight_version
        sample.metadata = {**sample.metadata, STATE_KEY: conversation.as_dict(),
                           METRICS_KEY: self.metrics(conversation, status)}
        return sample

    def metrics(self, conversation: Conversation, status: Status) -> dict[str, float]:
        """The sample's values of the step metrics (``rollout/<name>`` once averaged)."""
        values = {"turns_mean": float(conversation.turns), "tool_calls_mean": float(conversation.tool_calls),
                  "tool_errors_mean": float(conversation.tool_errors),
                  "tool_seconds_mean": float(conversation.tool_seconds),
                  "truncated_fraction": float(status == Status.TRUNCATED)}
        if self.options.tool_call_format == "chat-template":
            values["template_mismatch_fraction"] = float(bool(conversation.mismatch))
        return values

    async def run_tools(self, ctx: RolloutView, calls: list[FoundCall],
                        sample: Sample) -> list[tuple[str, bool, float]]:
        """:meth:`run_tool` of each of a turn's ``calls``, one after the other, in order (a later
        call may depend on what an earlier one did, as the model wrote them in that order)."""
        return [await self.run_tool(ctx, call, sample) for call in calls]

    async def run_tool(self, ctx: RolloutView, call: FoundCall, sample: Sample) -> tuple[str, bool, float]:
        """``(answer, failed, seconds)`` of one call: the tool's text, or a one-line ``error: ...``
        (see the module docstring); never raises, except when the rollout itself is cancelled."""
        if call.error:
            return f"error: {call.error}", True, 0.0
        tool = ctx.tools.get(call.name)
        if tool is None:
            known = ", ".join(ctx.tools) or "none"
            return f"error: there is no tool '{call.name}' (tools: {known})", True, 0.0
        timeout, limit = self.options.tool_timeout, self.options.tool_max_output_chars
        began = time.perf_counter()
        try:
            answer: Any = await asyncio.wait_for(tool(copy.deepcopy(call.arguments), sample), timeout)
        except ToolError as exc:
            return one_line(f"error: {exc}"), True, time.perf_counter() - began
        except TimeoutError:
            return f"error: tool '{call.name}' did not answer within {timeout:g} s", True, time.perf_counter() - began
        except Exception as exc:  # noqa: BLE001 - a failing tool is told to the model, never crashes the rollout
            return (one_line(f"error: tool '{call.name}' failed: {type(exc).__name__}: {exc}"), True,
                    time.perf_counter() - began)
        seconds = time.perf_counter() - began
        if not isinstance(answer, str):
            return f"error: tool '{call.name}' answered {type(answer).__name__}, not text", True, seconds
        if len(answer) > limit:
            return f"{answer[:limit]} [cut: the answer had {len(answer)} characters, the limit is {limit}]", True, \
                seconds
        return answer, False, seconds


async def until_aborted(ctx: RolloutView, work: Coroutine[Any, Any, T]) -> T | None:
    """``work``'s result, or ``None`` when ``ctx.aborting`` is set first (``work`` is then
    cancelled and awaited). A result that is ready when the abort comes is kept."""
    task = asyncio.ensure_future(work)
    aborted = asyncio.ensure_future(ctx.aborting.wait())
    try:
        await asyncio.wait((task, aborted), return_when=asyncio.FIRST_COMPLETED)
    finally:
        aborted.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    return task.result() if not task.cancelled() else None


def one_line(text: str) -> str:
    """``text`` with its line breaks turned into spaces (error messages are one line)."""
    return " ".join(text.split("\n"))
