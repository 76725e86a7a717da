"""A scripted policy that calls a named tool, so a tool's tests run a real multi-turn rollout on the
CPU without a trained model.

A tool plugin's test::

    from plasmid.testing.toolcalls import formats_for, run_tool_call
    import my_package.plugin

    @pytest.mark.parametrize("tool_call_format", formats_for("my-tool", {"text": "abc"}))
    def test_a_rollout_calls_it(tool_call_format):
        rollout = run_tool_call(my_package.plugin, "my-tool", {"text": "abc"}, tool_call_format=tool_call_format)
        assert rollout.metrics["tool_calls_mean"] == 1.0 and rollout.metrics["tool_errors_mean"] == 0.0
        assert "cba" in rollout.outputs[0]          # the tool's answer, in the sample, loss-masked

:func:`run_tool_call` builds the tool from its plugin and ``--generate multiturn`` (the
plasmid-multiturn package) as a run does, and drives one rollout whose engine is a
:class:`plasmid.testing.scripted.ScriptedEngine` playing :class:`ToolCallPolicy`: its first turns
write the given calls in the format's syntax, its last turn a final answer and EOS. Every format
of ``--tool-call-format`` (:data:`TOOL_CALL_FORMATS`) is written as plasmid's parsers read it:

- ``tagged`` and ``chat-template``: ``<tool_call>{"name": NAME, "arguments": {...}}</tool_call>``
  (Hermes / Qwen, also what the agent gateway parses);
- ``mistral``: ``[TOOL_CALLS][{"name": NAME, "arguments": {...}}]``;
- ``compact``: ``<call>EXPRESSION</call>``, which always calls the ``calculator`` tool with
  ``{"expression": EXPRESSION}``: no other call can be written in it (:func:`formats_for` leaves it
  out for other calls, :func:`call_text` refuses them).

The policy works with any :class:`plasmid.protocols.Tokenizer`; :class:`ByteTokenizer` (one id a
byte, and a ChatML chat template with tools, written in Python) is the default, so nothing needs
torch, transformers or a model directory. Imports no torch.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from plasmid.config import Config
from plasmid.context import RolloutContext
from plasmid.protocols import Tokenizer, Tool
from plasmid.session import build_tools
from plasmid.testing import make_config, make_registry
from plasmid.testing.scripted import Call, Reply, ScriptedEngine
from plasmid.types import Sample, SamplingParams, Status

#: The values of ``--tool-call-format`` (plasmid-multiturn) that the policy writes.
TOOL_CALL_FORMATS = ("tagged", "chat-template", "mistral", "compact")
#: The one tool a ``compact`` call calls, and the argument its text becomes.
COMPACT_TOOL, COMPACT_ARGUMENT = "calculator", "expression"


def formats_for(name: str, arguments: Mapping[str, Any]) -> tuple[str, ...]:
    """The formats of :data:`TOOL_CALL_FORMATS` in which a call of tool ``name`` (the name the model
    calls) with ``arguments`` can be written: all of them for ``calculator`` with only an
    ``expression`` string, the others for any other call."""
    compact = name == COMPACT_TOOL and set(arguments) == {COMPACT_ARGUMENT} and isinstance(
        arguments[COMPACT_ARGUMENT], str)
    return TOOL_CALL_FORMATS if compact else tuple(f for f in TOOL_CALL_FORMATS if f != "compact")


def call_text(tool_call_format: str, name: str, arguments: Mapping[str, Any]) -> str:
    """The text of a call of tool ``name`` with ``arguments`` in ``tool_call_format``, as a model
    writes it (see the module docstring).

    :raises ValueError: an unknown format, or a call that the format cannot write (``compact``
        and anything but ``calculator`` with ``{"expression": str}``).
    """
    if tool_call_format not in TOOL_CALL_FORMATS:
        raise ValueError(f"unknown tool-call format {tool_call_format!r}; formats: {', '.join(TOOL_CALL_FORMATS)}")
    if tool_call_format not in formats_for(name, arguments):
        raise ValueError(f"--tool-call-format compact can only call {COMPACT_TOOL} with "
                         f"{{{COMPACT_ARGUMENT!r}: str}}, not {name!r} with {dict(arguments)!r}; use "
                         f"{', '.join(formats_for(name, arguments))}")
    if tool_call_format == "compact":
        return f"<call>{arguments[COMPACT_ARGUMENT]}</call>"
    payload = json.dumps({"name": name, "arguments": dict(arguments)})
    return f"[TOOL_CALLS][{payload}]" if tool_call_format == "mistral" else f"<tool_call>{payload}</tool_call>"


class ByteTokenizer:
    """A :class:`plasmid.protocols.Tokenizer` without a vocabulary file: ids 0-255 are the bytes of
    the UTF-8 text, :attr:`eos_token_id` (256) ends a sequence. It can spell any text, so any tool
    call and any tool answer round-trip exactly.

    :meth:`apply_chat_template` renders ChatML (``<|im_start|>ROLE\\nCONTENT<|im_end|>\\n``), the
    tools as a system message listing their JSON specs, ``tool`` messages as user turns holding
    ``<tool_response>\\nANSWER\\n</tool_response>``, and assistant messages verbatim, so a rendering
    extends the previous one (what ``--tool-call-format chat-template`` requires).
    """

    eos_token_id = 256
    #: Only tested for truth by the ``chat-template`` format: this tokenizer has a chat template.
    chat_template = "ChatML with tools (ByteTokenizer.apply_chat_template)"

    def __len__(self) -> int:
        return 257

    def encode(self, text: str, add_special_tokens: bool = False, **_: Any) -> list[int]:
        """The UTF-8 bytes of ``text`` (nothing special is ever added)."""
        return list(text.encode("utf-8"))

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False, **_: Any) -> str:
        """The text of ``token_ids``; EOS reads ``<|endoftext|>`` unless ``skip_special_tokens``; an
        incomplete UTF-8 sequence reads as U+FFFD."""
        text, run = [], bytearray()
        for token in token_ids:
            if token < 256:
                run.append(token)
                continue
            text.append(run.decode("utf-8", errors="replace"))
            run.clear()
            if not skip_special_tokens:
                text.append("<|endoftext|>")
        text.append(run.decode("utf-8", errors="replace"))
        return "".join(text)

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None,
                            add_generation_prompt: bool = False, tokenize: bool = True, **_: Any) -> str | list[int]:
        """The conversation as ChatML text (ids with ``tokenize``); see the class docstring."""
        parts = []
        if tools:
            specs = "\n".join(json.dumps(tool) for tool in tools)
            parts.append(f"<|im_start|>system\n# Tools\n{specs}\nCall one as <tool_call>{{\"name\": ..., "
                         f"\"arguments\": ...}}</tool_call><|im_end|>\n")
        for message in messages:
            role, content = message["role"], message.get("content") or ""
            if role == "tool":
                parts.append(f"<|im_start|>user\n<tool_response>\n{content}\n</tool_response><|im_end|>\n")
            else:
                parts.append(f"<|im_start|>{role}\n{content}<|im_end|>\n")
        if add_generation_prompt:
            parts.append("<|im_start|>assistant\n")
        text = "".join(parts)
        return self.encode(text) if tokenize else text


@dataclass
class ToolCallPolicy:
    """A script for :class:`plasmid.testing.scripted.ScriptedEngine`: the policy of a model that
    makes ``calls`` (``(name, arguments)`` each, one per turn, in order) in ``tool_call_format``,
    then answers ``answer`` and EOS.

    Which turn a request is comes from its prompt, not from a counter, so many conversations may
    share one engine: a request's calls so far are the replies of this policy that its prompt
    extends (each turn's prompt is the previous prompt, the reply and the tool's answer, token for
    token). A reply is exactly the call's ids (or the answer's and EOS), so a generate function
    that cuts a turn after its call keeps all of it.
    """

    tokenizer: Tokenizer
    calls: Sequence[tuple[str, Mapping[str, Any]]]
    tool_call_format: str = "tagged"
    answer: str = "done"
    logprob: float = -0.5
    made: set[tuple[int, ...]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.replies = [self.tokenizer.encode(call_text(self.tool_call_format, name, arguments),
                                              add_special_tokens=False) for name, arguments in self.calls]
        eos = self.tokenizer.eos_token_id
        self.final = self.tokenizer.encode(self.answer, add_special_tokens=False) + ([eos] if eos is not None else [])

    @property
    def longest_reply(self) -> int:
        """Tokens in the longest reply: the ``max_new_tokens`` that no reply exceeds."""
        return max(len(reply) for reply in [*self.replies, self.final])

    def __call__(self, prompt_ids: list[int], params: SamplingParams) -> Reply:
        prompt = tuple(prompt_ids)
        turn = sum(1 for made in self.made if prompt[:len(made)] == made)
        if turn >= len(self.replies):
            ids = list(self.final)
        else:
            ids = list(self.replies[turn])
            self.made.add(prompt + tuple(ids))
        return Reply(ids, [self.logprob] * len(ids))


@dataclass
class ToolCallRollout:
    """What :func:`run_tool_call` did.

    :ivar sample: the finished sample (prompt, the calls, the tool's answers, the final answer).
    :ivar tool: the tool as built for the run.
    :ivar requests: the engine requests the rollout made (prompt ids and parameters), in order.
    :ivar outputs: the text of each loss-masked run of the response (``loss_mask`` 0): what the
        rollout appended after each call, the tool's answer in the format's wrapping.
    :ivar metrics: ``sample.metadata["rollout_metrics"]`` (``tool_calls_mean``,
        ``tool_errors_mean``, ``turns_mean``, ...).
    """

    sample: Sample
    tool: Tool
    requests: list[Call]
    outputs: list[str]
    metrics: dict[str, float]


def masked_outputs(sample: Sample, tokenizer: Tokenizer) -> list[str]:
    """The decoded runs of ``sample``'s response tokens whose ``loss_mask`` is 0, in order."""
    runs: list[list[int]] = []
    previous = 1
    masks = sample.loss_mask if sample.loss_mask is not None else [1] * sample.response_length
    for token, mask in zip(sample.response_tokens, masks, strict=True):
        if mask == 0:
            if previous != 0:
                runs.append([])
            runs[-1].append(token)
        previous = mask
    return [tokenizer.decode(ids, skip_special_tokens=False) for ids in runs]


def multiturn_plugin() -> Any:
    """The hook module of the installed plugin named ``multiturn`` (plasmid-multiturn, ``--generate
    multiturn``), found through its ``plasmid`` entry point as a run finds it (the kernel and its
    testing kit name no plugin module)."""
    found = metadata.entry_points(group="plasmid", name="multiturn")
    if not found:
        raise ImportError("run_tool_call drives --generate multiturn: pip install plasmid-multiturn")
    return next(iter(found)).load()


def run_tool_call(plugin: Any, tool: str, arguments: Mapping[str, Any], *, tool_call_format: str = "tagged",
                  calls: int = 1, answer: str = "done", prompt: str = "Use the tool.", label: Any = None,
                  metadata: Mapping[str, Any] | None = None, tokenizer: Tokenizer | None = None,
                  **options: Any) -> ToolCallRollout:
    """One multi-turn rollout (``--generate multiturn --tools TOOL``) in which the policy calls tool
    ``tool`` with ``arguments`` ``calls`` times, one call a turn, then answers ``answer``.

    :param plugin: the tool's plugin (the module with its hookimpls); ``tool`` is the name it
        registers, the call uses the built tool's :attr:`~plasmid.protocols.Tool.name`.
    :param prompt: the prompt; ``label`` and ``metadata`` go on the sample (the tool sees them).
    :param tokenizer: default :class:`ByteTokenizer` (the ``chat-template`` format needs one with a
        chat template that renders tools).
    :param options: options of the run (Python names: ``tool_timeout=1.0``, the tool's own); the
        response budget ``max_response_tokens`` defaults to 1,000,000 tokens here, so long answers
        are seen whole.
    :raises ValueError: ``tool_call_format`` cannot write the call (:func:`call_text`).
    """
    multiturn = multiturn_plugin()
    options.setdefault("max_response_tokens", 1_000_000)
    config: Config = make_config(plugin, multiturn, generate="multiturn", tools=[tool],
                                 tool_call_format=tool_call_format, **options)
    registry = make_registry(plugin, multiturn)
    tools = build_tools(config, registry)
    built = next(iter(tools.values()))
    words = tokenizer or ByteTokenizer()
    policy = ToolCallPolicy(words, [(built.name, arguments)] * calls, tool_call_format, answer)
    engine = ScriptedEngine(policy)
    generate = registry.get("generate", "multiturn").load()(config)
    nothing: Any = None  # a rollout of one sample reads no data source and scores nothing
    ctx = RolloutContext(config=config, engines=[engine], data_source=nothing, tokenizer=words, generate=generate,
                         rewards=nothing, tools=tools)
    sample = Sample(prompt=prompt, tokens=list(words.encode(prompt, add_special_tokens=False)), label=label,
                    metadata=dict(metadata or {}), status=Status.PENDING)
    eos = words.eos_token_id
    params = SamplingParams(max_new_tokens=policy.longest_reply, stop_token_ids=(eos,) if eos is not None else ())
    done = asyncio.run(ctx.generate(ctx, sample, params))
    finished = done[0] if isinstance(done, list) else done
    return ToolCallRollout(finished, built, list(engine.calls), masked_outputs(finished, words),
                           dict(finished.metadata.get("rollout_metrics", {})))


__all__ = ["COMPACT_ARGUMENT", "COMPACT_TOOL", "TOOL_CALL_FORMATS", "ByteTokenizer", "ToolCallPolicy",
           "ToolCallRollout", "call_text", "formats_for", "masked_outputs", "run_tool_call"]
