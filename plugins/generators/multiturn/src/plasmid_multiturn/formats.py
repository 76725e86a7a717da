"""Tool-call formats: how a call appears in the model's text and how a tool's answer is appended.

A format is a small provider (``--tool-call-format``, :data:`FORMATS`) with four duties:

- :meth:`ToolCallFormat.prompt_ids`: the conversation's first tokens, from the prompt sample;
- :meth:`ToolCallFormat.stop_token_ids`: extra stop tokens that end a model turn at a call (the
  closing tag, when the tokenizer has it as one token; otherwise the turn runs on and the loop
  cuts it after the call);
- :meth:`ToolCallFormat.find_call`: the complete calls of a turn's text, parsed: the first, with
  the further calls of the same turn as :attr:`FoundCall.siblings` (every complete span up to one
  whose syntax closes the turn's calls, see :func:`found_call`);
- :meth:`ToolCallFormat.tool_turn`: the text appended after the model's call(s), with the tools'
  answers in order, up to where the model speaks again. Its token ids are appended as they are:
  the history is never decoded and encoded again.

``tagged`` and ``chat-template`` parse calls in the Hermes / Qwen style that most tool-calling chat
templates use, ``<tool_call>{"name": NAME, "arguments": {...}}</tool_call>`` (``arguments`` may also
be a JSON string of an object, as in OpenAI's API): the ``hermes`` parser of the shared family
(:mod:`plasmid_serving.parsers`). ``--tool-parser NAME`` replaces a format's parser with another of
the family (``chat-template`` with a Llama 3.1 template and ``--tool-parser llama3_json``, say): the
format keeps its prompt, stop tokens and tool turns, and only how calls are read changes. With
``--reasoning-parser NAME``, calls are read only after the model's reasoning (a call it writes
while thinking is not run, and a turn still thinking has no call). ``compact`` is for models too small to spell
JSON (the quickstart's tiny model on ``--task toolcalc``): ``<call>12*34</call>`` calls the
``calculator`` tool with that expression. ``mistral`` is Mistral's syntax (the ``mistral`` parser),
several calls in one turn: ``[TOOL_CALLS][{"name": NAME, "arguments": {...}}, ...]`` (or the newer
``[TOOL_CALLS]NAME[ARGS]{...}`` per call), each answer appended in order as
``[TOOL_RESULTS]{"content": ANSWER}[/TOOL_RESULTS]``. ``harmony`` is OpenAI's harmony (gpt-oss:
the ``openai`` parser): calls are messages ``to=functions.NAME`` ending in ``<|call|>``, answers are
appended as harmony tool messages (:class:`Harmony`). ``compact`` reads its own syntax and takes
neither parser option.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from plasmid.errors import UsageError
from plasmid.protocols import Tokenizer, Tool
from plasmid.types import Sample
from plasmid_serving.parsers import CallSpan, ReasoningParser, ToolCall, ToolParser
from plasmid_serving.parsers.harmony import CALL as HARMONY_CALL
from plasmid_serving.parsers.harmony import CHANNEL as HARMONY_CHANNEL
from plasmid_serving.parsers.harmony import END as HARMONY_END
from plasmid_serving.parsers.harmony import MESSAGE as HARMONY_MESSAGE
from plasmid_serving.parsers.harmony import START as HARMONY_START
from plasmid_serving.parsers.harmony import Harmony as HarmonyParser
from plasmid_serving.parsers.tools import TOOL_CALL_CLOSE, Hermes
from plasmid_serving.parsers.tools import Mistral as MistralParser

CALL_CLOSE = TOOL_CALL_CLOSE
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"


@dataclass(frozen=True)
class FoundCall:
    """The (first) complete call of a turn's text; the turn's further calls are its siblings.

    :ivar end: characters of the text up to the end of the turn's last call (the turn ends there).
    :ivar name: the called tool's name ('' when the call could not be parsed).
    :ivar arguments: its decoded arguments.
    :ivar error: why the call could not be parsed ('' when it could); told to the model.
    :ivar siblings: the further calls the model made in the same turn, run after this one, in
        order; their ``end`` is this call's.
    """

    end: int
    name: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    siblings: tuple[FoundCall, ...] = ()

    @property
    def all(self) -> list[FoundCall]:
        """This call and its siblings, in the order they are run."""
        return [self, *self.siblings]


@dataclass
class Conversation:
    """Where one sample's conversation stands: counters for the metrics, and what a format keeps
    between turns. Plain data, kept in ``sample.metadata["multiturn"]`` so that a partial rollout
    resumes where it stopped.

    :ivar turns: model turns begun; :ivar tool_calls: calls run (parsed or not);
    :ivar tool_errors: calls that failed (unparsable, unknown tool, raised, timed out, answer too
        long or not text); :ivar tool_seconds: wall-clock seconds spent in tools;
    :ivar turn_start: where the current model turn begins, as an index into the response tokens;
    :ivar text: the chat-template text of the conversation so far (chat-template format);
    :ivar messages: the chat messages so far (chat-template format);
    :ivar mismatch: why the conversation stopped early because the chat template could not extend it
        (it rewrote the history, or it raised while rendering a tool turn);
    :ivar images: the conversation's images so far, the prompt's then the tools', as portable image
        parts (:mod:`plasmid_multiturn.images`).
    """

    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tool_seconds: float = 0.0
    turn_start: int = 0
    text: str = ""
    messages: list[dict[str, Any]] = field(default_factory=list)
    mismatch: str = ""
    images: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"turns": self.turns, "tool_calls": self.tool_calls, "tool_errors": self.tool_errors,
                "tool_seconds": self.tool_seconds, "turn_start": self.turn_start, "text": self.text,
                "messages": [dict(message) for message in self.messages], "mismatch": self.mismatch,
                "images": [dict(part) for part in self.images]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Conversation:
        return cls(**{key: data[key] for key in cls().as_dict() if key in data})


class TemplateMismatch(Exception):
    """The chat template cannot extend the conversation the sample holds: it renders the
    conversation so far differently from the sample's tokens (it would rewrite history), or it
    raises while rendering the next tool turn (a template that demands what the format does not
    send, e.g. a ``tool_call_id`` on tool messages). The conversation ends there rather than
    re-tokenising or crashing the rollout."""


class ToolCallFormat(Protocol):
    """A tool-call format; see the module docstring."""

    def prompt_ids(self, tokenizer: Tokenizer, sample: Sample, tools: Mapping[str, Tool],
                   conversation: Conversation) -> list[int]: ...

    def stop_token_ids(self, tokenizer: Tokenizer) -> tuple[int, ...]: ...

    def find_call(self, text: str, tools: list[dict[str, Any]] | None = None) -> FoundCall | None:
        """The complete calls of the turn ``text``, the first with the others as its siblings
        (``tools``: the tools offered, as OpenAI specs); ``None`` when it has none."""
        ...

    def tool_turn(self, tokenizer: Tokenizer, conversation: Conversation, turn_text: str, calls: list[FoundCall],
                  answers: list[Any], tools: Mapping[str, Tool]) -> str:
        """The text appended after the turn's ``calls`` (``found.all``), ``answers[i]`` the answer to
        ``calls[i]``: text, or (``chat-template`` only) a content list of text parts and
        ``{"type": "image"}`` places, one image token each in the text (:mod:`plasmid_multiturn.images`)."""
        ...


def found_call(parser: ToolParser, text: str, tools: list[dict[str, Any]] | None = None,
               reasoning: ReasoningParser | None = None) -> FoundCall | None:
    """The calls of the turn ``text`` as ``parser`` reads them (after the reasoning ``reasoning``
    splits off, when given): every complete span, in order, up to the first the syntax marks
    :attr:`~plasmid_serving.parsers.CallSpan.final` (no call of the turn follows it). The first
    call is the :class:`FoundCall`, the others its siblings, all ending where the last span taken
    ends; a malformed span is one call with its error (told to the model), the others still run.
    ``None`` when there is no complete span (yet).

    Which spans are the turn's is the loop's to decide from the text it passes: the whole turn
    once the engine has ended it (a stop token, ``--max-new-tokens``, an abort); what comes after
    the last span is cut."""
    offset = 0
    if reasoning is not None:
        thought, offset = reasoning.split(text)
        if thought is None:
            offset = 0
    taken: list[CallSpan] = []
    for span in parser.spans(text[offset:], tools):
        taken.append(span)
        if span.final:
            break
    if not taken:
        return None
    end = offset + taken[-1].end
    found: list[FoundCall] = []
    for span in taken:
        if span.error or not span.calls:
            found.append(FoundCall(end, error=span.error or "a tool call holds no call"))
        else:
            found.extend(_found(call, end) for call in span.calls)
    first, *rest = found
    return replace(first, siblings=tuple(rest))


def _found(call: ToolCall, end: int) -> FoundCall:
    return FoundCall(end, name=call.name, arguments=call.arguments, error=call.error)


class Parsed:
    """Base of the formats whose calls a parser of the shared family reads: ``parser`` (else the
    format's own, :attr:`default_parser`) after ``reasoning`` (else none)."""

    #: the parser of the format's own syntax
    default_parser: ToolParser = Hermes()

    def __init__(self, parser: ToolParser | None = None, reasoning: ReasoningParser | None = None) -> None:
        self.parser = parser or self.default_parser
        self.reasoning = reasoning

    def find_call(self, text: str, tools: list[dict[str, Any]] | None = None) -> FoundCall | None:
        return found_call(self.parser, text, tools, self.reasoning)


def single_token(tokenizer: Tokenizer, text: str) -> tuple[int, ...]:
    """``(id,)`` when ``text`` is one token of ``tokenizer``, else ``()``."""
    try:
        ids = tokenizer.encode(text, add_special_tokens=False)
    except Exception:  # noqa: BLE001 - a tokenizer that cannot encode the tag just has no such stop token
        return ()
    return (int(ids[0]),) if len(ids) == 1 else ()


class Tagged(Parsed):
    """``--tool-call-format tagged``: the prompt's tokens as the data source made them (its prompt
    tells the model about the tools); calls are ``<tool_call>{json}</tool_call>`` in the text and
    each answer is appended as ``<tool_response>ANSWER</tool_response>``, nothing else."""

    def prompt_ids(self, tokenizer: Tokenizer, sample: Sample, tools: Mapping[str, Tool],
                   conversation: Conversation) -> list[int]:
        return list(sample.prompt_tokens)

    def stop_token_ids(self, tokenizer: Tokenizer) -> tuple[int, ...]:
        return single_token(tokenizer, CALL_CLOSE)

    def tool_turn(self, tokenizer: Tokenizer, conversation: Conversation, turn_text: str, calls: list[FoundCall],
                  answers: list[str], tools: Mapping[str, Tool]) -> str:
        return "".join(f"{RESPONSE_OPEN}{answer}{RESPONSE_CLOSE}" for answer in answers)


def tool_schemas(tools: Mapping[str, Tool]) -> list[dict[str, Any]]:
    """The tools as OpenAI function specs (what ``apply_chat_template(tools=...)`` takes)."""
    return [{"type": "function", "function": {"name": name, "description": tool.description,
                                              "parameters": tool.parameters}} for name, tool in tools.items()]


class ChatTemplate(Parsed):
    """``--tool-call-format chat-template``: the tokenizer's own chat template with ``tools=``
    (Hugging Face ``apply_chat_template``), rendered incrementally.

    The prompt is the sample's chat messages (a plain-text prompt becomes one user message)
    rendered with the tools and the generation prompt. After a call, the model's turn text becomes
    an assistant message and the answer a ``tool`` message; the conversation is rendered again and
    must *start with* the text so far (the previous rendering plus the model's turn exactly as
    generated): what follows it (the end of the assistant turn, the tool message, the next
    generation prompt) is the appended text. A template that renders the history differently
    (strips earlier reasoning, re-formats a call), or that raises while rendering a tool turn
    (Jinja's ``raise_exception`` on a message it rejects, or any other error), raises
    :class:`TemplateMismatch`. (One that cannot render the prompt itself is not caught: every
    sample would fail alike, so the run stops with the template's error.)
    """

    def _render(self, tokenizer: Tokenizer, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        apply = getattr(tokenizer, "apply_chat_template", None)
        if apply is None or not getattr(tokenizer, "chat_template", None):
            raise UsageError("--tool-call-format chat-template: the tokenizer has no chat template; use "
                             "--tool-call-format tagged, or a model whose tokenizer has one")
        text = apply(messages, tools=tools or None, add_generation_prompt=True, tokenize=False)
        return str(text)

    def prompt_ids(self, tokenizer: Tokenizer, sample: Sample, tools: Mapping[str, Tool],
                   conversation: Conversation) -> list[int]:
        prompt = sample.prompt
        messages = [dict(m) for m in prompt] if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        conversation.messages = messages
        conversation.text = self._render(tokenizer, messages, tool_schemas(tools))
        return list(tokenizer.encode(conversation.text, add_special_tokens=False))

    def stop_token_ids(self, tokenizer: Tokenizer) -> tuple[int, ...]:
        return single_token(tokenizer, CALL_CLOSE)

    def tool_turn(self, tokenizer: Tokenizer, conversation: Conversation, turn_text: str, calls: list[FoundCall],
                  answers: list[Any], tools: Mapping[str, Tool]) -> str:
        messages = [*conversation.messages, {"role": "assistant", "content": turn_text},
                    *({"role": "tool", "name": call.name, "content": answer}
                      for call, answer in zip(calls, answers, strict=True))]
        try:
            rendered = self._render(tokenizer, messages, tool_schemas(tools))
        except UsageError:
            raise
        except Exception as exc:   # a template that rejects the tool turn ends this sample, not the run
            raise TemplateMismatch(f"the chat template cannot render turn {conversation.turns}'s tool answer: "
                                   f"{type(exc).__name__}: {exc}") from exc
        expected = conversation.text + turn_text
        if not rendered.startswith(expected):
            at = next((i for i, (a, b) in enumerate(zip(rendered, expected, strict=False)) if a != b),
                      min(len(rendered), len(expected)))
            raise TemplateMismatch(f"the chat template renders turn {conversation.turns}'s history differently "
                                   f"from the sample's tokens at character {at}: {expected[at:at + 40]!r} became "
                                   f"{rendered[at:at + 40]!r}")
        conversation.messages, conversation.text = messages, rendered
        return rendered[len(expected):]


COMPACT_OPEN, COMPACT_CLOSE = "<call>", "</call>"
RESULT_OPEN, RESULT_CLOSE = "<result>", "</result>"
#: The tool a compact call calls, and the argument its text becomes.
COMPACT_TOOL, COMPACT_ARGUMENT = "calculator", "expression"
_COMPACT_CALL = re.compile(re.escape(COMPACT_OPEN) + r"(.*?)" + re.escape(COMPACT_CLOSE), re.DOTALL)


class Compact:
    """``--tool-call-format compact``: ``<call>EXPRESSION</call>`` in the model's text calls the
    ``calculator`` tool with ``{"expression": EXPRESSION}`` (surrounding blanks stripped), and the
    answer is appended as ``<result>ANSWER</result>``. The prompt's tokens are the data source's.

    Made for tokenizers that cannot spell the tagged JSON call in few tokens (the quickstart's
    character tokenizer has the four tags as single tokens for ``--task toolcalc``, so ``</call>``
    ends the turn). (The generate loop keeps only the characters of an answer the tokenizer can
    encode, for every format: a character tokenizer without letters still gets the digits of an
    error message, never a crash.)
    """

    def prompt_ids(self, tokenizer: Tokenizer, sample: Sample, tools: Mapping[str, Tool],
                   conversation: Conversation) -> list[int]:
        return list(sample.prompt_tokens)

    def stop_token_ids(self, tokenizer: Tokenizer) -> tuple[int, ...]:
        return single_token(tokenizer, COMPACT_CLOSE)

    def find_call(self, text: str, tools: list[dict[str, Any]] | None = None) -> FoundCall | None:
        match = _COMPACT_CALL.search(text)
        if match is None:
            return None
        return FoundCall(match.end(), name=COMPACT_TOOL, arguments={COMPACT_ARGUMENT: match.group(1).strip()})

    def tool_turn(self, tokenizer: Tokenizer, conversation: Conversation, turn_text: str, calls: list[FoundCall],
                  answers: list[str], tools: Mapping[str, Tool]) -> str:
        return "".join(f"{RESULT_OPEN}{answer}{RESULT_CLOSE}" for answer in answers)


MISTRAL_RESULTS_OPEN, MISTRAL_RESULTS_CLOSE = "[TOOL_RESULTS]", "[/TOOL_RESULTS]"


class Mistral(Parsed):
    """``--tool-call-format mistral``: Mistral's syntax, several calls in one turn.

    The model writes ``[TOOL_CALLS]`` and a JSON list of calls, ``[{"name": NAME, "arguments":
    {...}}, ...]`` (one object alone is one call; ``arguments`` may be a JSON string, and other keys
    such as ``id`` are ignored), or, with v11 and later tokenizers, ``[TOOL_CALLS]NAME[ARGS]{...}``
    once per call (several in one turn). A call is complete where its JSON value ends; a list
    closes the turn's calls (the turn is cut after it), while ``NAME[ARGS]`` calls are all read
    when the turn ends and it is cut after the last (see the ``mistral`` parser,
    :class:`plasmid_serving.parsers.tools.Mistral`, for what is malformed: told to the model).
    Every call is run, in order (a malformed entry is answered with an error and the others still
    run), and each answer is appended, in the same order, as
    ``[TOOL_RESULTS]{"content": ANSWER}[/TOOL_RESULTS]`` (the answer JSON-encoded). A
    ``[TOOL_CALLS]`` whose JSON never completes before the turn ends is no call: the turn is the
    model's answer. The prompt's tokens are the data source's; no stop token is added.
    """

    default_parser: ToolParser = MistralParser()

    def prompt_ids(self, tokenizer: Tokenizer, sample: Sample, tools: Mapping[str, Tool],
                   conversation: Conversation) -> list[int]:
        return list(sample.prompt_tokens)

    def stop_token_ids(self, tokenizer: Tokenizer) -> tuple[int, ...]:
        return ()

    def tool_turn(self, tokenizer: Tokenizer, conversation: Conversation, turn_text: str, calls: list[FoundCall],
                  answers: list[str], tools: Mapping[str, Tool]) -> str:
        return "".join(f"{MISTRAL_RESULTS_OPEN}{json.dumps({'content': answer})}{MISTRAL_RESULTS_CLOSE}"
                       for answer in answers)


class Harmony(ChatTemplate):
    """``--tool-call-format harmony``: OpenAI's harmony conversations (gpt-oss), read by the shared
    ``openai`` parser (:class:`plasmid_serving.parsers.harmony.Harmony`).

    The prompt is the sample's chat messages rendered by the tokenizer's chat template with the tools
    and the generation prompt (a harmony template ends it with ``<|start|>assistant``), as
    ``chat-template`` renders it. The model's turn is a run of harmony messages; a message addressed
    ``to=functions.NAME`` and closed by ``<|call|>`` is a call (its body the JSON arguments), and
    ``<|call|>`` ends the turn (a stop token when the tokenizer has it as one token, as gpt-oss's
    does). Each answer is appended as harmony's tool message, then the next generation prompt::

        <|start|>functions.NAME to=assistant<|channel|>commentary<|message|>ANSWER<|end|><|start|>assistant

    written by this format, never by re-rendering the conversation (gpt-oss's own template drops
    earlier reasoning and moves a past call's recipient, so it cannot extend a conversation token for
    token). The answer is the tool's text as it is (a JSON answer stays JSON). ``--reasoning-parser
    openai_gptoss`` reads calls only after the opening ``analysis`` messages (a call is never read
    from them anyway: they address no one).
    """

    default_parser: ToolParser = HarmonyParser()

    def prompt_ids(self, tokenizer: Tokenizer, sample: Sample, tools: Mapping[str, Tool],
                   conversation: Conversation) -> list[int]:
        try:
            return super().prompt_ids(tokenizer, sample, tools, conversation)
        except UsageError:
            raise UsageError("--tool-call-format harmony: the tokenizer has no chat template; use a harmony model "
                             "(gpt-oss) or give the tokenizer a harmony chat template") from None

    def stop_token_ids(self, tokenizer: Tokenizer) -> tuple[int, ...]:
        return single_token(tokenizer, HARMONY_CALL)

    def tool_turn(self, tokenizer: Tokenizer, conversation: Conversation, turn_text: str, calls: list[FoundCall],
                  answers: list[Any], tools: Mapping[str, Tool]) -> str:
        answered = "".join(f"{HARMONY_START}functions.{call.name} to=assistant{HARMONY_CHANNEL}commentary"
                           f"{HARMONY_MESSAGE}{answer}{HARMONY_END}"
                           for call, answer in zip(calls, answers, strict=True))
        return f"{answered}{HARMONY_START}assistant"


def spellable(tokenizer: Tokenizer, text: str) -> str:
    """``text`` without the characters ``tokenizer`` cannot encode (all of it when it encodes whole);
    the generate loop applies it to every tool answer before a format wraps it."""
    try:
        tokenizer.encode(text, add_special_tokens=False)
        return text
    except Exception:  # noqa: BLE001 - a tokenizer without some character (no unknown token) raises
        pass
    kept = []
    for char in text:
        try:
            tokenizer.encode(char, add_special_tokens=False)
        except Exception:  # noqa: BLE001 - as above
            continue
        kept.append(char)
    return "".join(kept)


#: ``--tool-call-format`` -> the format's class (those but ``compact`` take ``parser=`` and ``reasoning=``).
FORMATS: dict[str, type[Tagged] | type[ChatTemplate] | type[Compact] | type[Mistral] | type[Harmony]] = {
    "tagged": Tagged, "chat-template": ChatTemplate, "compact": Compact, "mistral": Mistral, "harmony": Harmony}
