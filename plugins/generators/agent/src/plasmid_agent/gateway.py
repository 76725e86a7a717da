"""The gateway: OpenAI's ``/v1/chat/completions`` and ``/v1/completions`` on 127.0.0.1, in front
of the rollout engines, recording every call with its exact token ids and log-probs.

Each rollout is a :class:`Rollout` with a session key; a request names it in its path
(``/s/KEY/v1/...``, the base URL the agent is given) or as its bearer API key (``/v1/...``).

How a chat request becomes prompt ids (token in, token out): the messages are rendered with the
tokenizer's chat template (``add_generation_prompt=True``, the request's ``tools`` passed to it).
When the rendered text starts with the text of an earlier call of the rollout (its prompt text
followed by its completion as the model wrote it), the prompt ids are that call's prompt and
completion ids followed by the ids of the rest of the text alone: the model's own tokens are
reused, never re-encoded, so the next turn extends the previous one. When no earlier call
matches (the agent edited the history, or the template rewrites it), the whole text is encoded
afresh and the call starts a sample of its own (:mod:`plasmid_agent.recorder`). ``/v1/completions``
works the same way on the prompt text; a prompt given as token ids is used as it is.

Sampling: the run's ``--temperature``, ``--top-p``, ``--top-k`` and stop tokens apply to every call
(the request's are checked by type, then ignored: the trainer scores log-probs at the run's
temperature); ``max_tokens`` / ``max_completion_tokens`` is honoured up to ``--max-new-tokens``.
``n`` > 1 makes n engine calls on the same prompt (each its own seed and recorded call, so its own
sample unless it continues an earlier call). ``stop`` strings go to the engine
(``SamplingParams.stop``: torchgen, SGLang and vLLM stop on them), and the gateway cuts too
(:mod:`plasmid_agent.stops`), for engines that ignore them: the answer's text ends before the stop
string, the record keeps the engine's tokens through the one that completed it. Request fields are
checked by type, unknown ones ignored and known ones that cannot be honoured refused
(:mod:`plasmid_agent.fields`); with ``--agent-max-calls N`` a session's engine calls past N are
refused with 429. A call whose prompt and completion budget do not fit the model's context is
refused as vLLM refuses it: HTTP 400, ``This model's maximum context length is N tokens. However,
you requested M tokens (P in the messages, K in the completion). ...``
(:class:`~plasmid.errors.ContextLengthError`), whether the gateway knows the context or the engine
refuses the call. ``logprobs`` are the engine's log-prob of each sampled token, exactly.
``top_logprobs`` (chat: 0-20, with ``logprobs: true``; completions: ``logprobs`` 0-5) is checked as
OpenAI does, but its lists are always empty: the engine protocol
(:meth:`plasmid.protocols.RolloutEngine.generate`) returns only the sampled token's log-prob, no
top-k alternatives, and the gateway does not make up ones it was not given.

``/v1/responses`` (OpenAI's Responses API, what the OpenAI Agents SDK calls by default) is the
chat endpoint with another request and answer shape (:mod:`plasmid_agent.responses`).

Images (a vision-language policy, ``--model`` with a ``vision_config``): ``user`` and ``tool``
messages may hold ``image_url`` parts (an agent's own images, a tool's image results). Before anything
is generated each is checked (:meth:`Gateway.images_of`: a data URL, or a local path with
``--agent-image-paths``, never a download; it decodes; at most ``--agent-max-image-pixels``; at most
``--agent-max-images`` a request), else a 400 naming the field; a text-only policy answers an image
part with a 400 naming the model. The template renders one image token per image, which the prompt
ids expand to the image's token count; a call reuses an earlier call's ids only when its images begin
with that call's images. The engine gets the images through its ``generate_with_images`` (an engine
without it: 400), and the recorded call keeps them (:attr:`plasmid_agent.recorder.Call.images`), so
a sample's ``metadata[plasmid_torch.vision.VISION_KEY]`` names the images its tokens hold and the
trainer computes with the same pixels; a tool image's tokens in a later turn are loss-masked.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from plasmid.errors import ContextLengthError, UsageError
from plasmid.protocols import RolloutEngine, Tokenizer
from plasmid.types import GenerationOutput, SamplingParams, Status
from plasmid_agent import fields, responses
from plasmid_agent.fields import RequestError, Sampling
from plasmid_agent.httpserver import Limits, Request, Response, error_response, serve
from plasmid_agent.recorder import Call
from plasmid_agent.stops import cut_at_stop
from plasmid_agent.toolcalls import parse_reply, special_tokens, without_special
from plasmid_serving.parsers import ReasoningParser, ToolParser, parse_message

__all__ = ["Choice", "Gateway", "RequestError", "Rollout"]

#: At most this many content chunks per streamed response (longer responses put several tokens in one).
MAX_STREAM_CHUNKS = 256
#: Sent with the 429 of ``--agent-max-calls``: OpenAI's clients do not retry a call that says so.
NO_RETRY = {"x-should-retry": "false"}


@dataclass
class Rollout:
    """One agent rollout: the engine and sampling parameters its calls use, and its recorded calls
    (in the order they finished; the ``n`` calls of one request in choice order).

    :ivar aborted: a call came back aborted, or the step's ``aborting`` event was set (the driver
        is ending the step); later calls are refused.
    :ivar aborting: the step's abort event (:attr:`plasmid.protocols.RolloutView.aborting`), or None.
    :ivar errors: what the gateway refused or failed, for the message when the agent then fails.
    :ivar started: engine calls begun (each of a request's ``n`` counts).
    :ivar capped: a request was refused because it would pass ``--agent-max-calls``.
    """

    key: str
    engine: RolloutEngine
    params: SamplingParams
    calls: list[Call] = field(default_factory=list)
    aborted: bool = False
    errors: list[str] = field(default_factory=list)
    started: int = 0
    aborting: asyncio.Event | None = None
    capped: bool = False

    def next_seed(self) -> int | None:
        """A distinct, reproducible seed per call (the rollout's seed, then offsets)."""
        number = self.started
        self.started += 1
        if self.params.seed is None:
            return None
        return (self.params.seed + number * 7_919) % (2**31 - 1)


@dataclass
class Choice:
    """One completion of a request: its recorded call, the text the client is shown (before a
    stop string; special tokens skipped), OpenAI's finish reason (``stop`` or ``length``) and
    ``raw``, the text before the stop string with the special tokens kept (what parsers read: a
    tokenizer may make a format's markers special tokens, ``[TOOL_CALLS]``, harmony's ``<|channel|>``)."""

    call: Call
    text: str
    finish: str
    raw: str = ""


class Gateway:
    """The HTTP server and the rollouts it serves. Start it with :meth:`start` on the event loop
    the engines are called from; :meth:`open` a :class:`Rollout` per agent run.

    :param max_calls: engine calls one rollout may make (``--agent-max-calls``); ``None``: no cap.
    :param tool_parser: reads tool calls in a reply (``--tool-parser``; ``None``: ``hermes``).
    :param reasoning_parser: splits a reply's reasoning off into ``reasoning_content``
        (``--reasoning-parser``); ``None``: no reasoning is split off.
    :param vision: the policy's :class:`plasmid_torch.chat_images.ChatImages` when it is a
        vision-language model (then ``image_url`` parts are read, see :meth:`images_of`); ``None``: a
        request with an image part is refused with 400 naming ``policy``.
    :param image_limits: a :class:`plasmid_torch.chat_images.ImageLimits` (``--agent-max-images``,
        ``--agent-max-image-pixels``, ``--agent-image-paths``), with ``vision``.
    :param policy: how errors name the policy model (``--model DIR``).
    """

    def __init__(self, tokenizer: Tokenizer, model: str = "plasmid", context: int | None = None,
                 limits: Limits | None = None, max_calls: int | None = None, tool_parser: ToolParser | None = None,
                 reasoning_parser: ReasoningParser | None = None, vision: Any = None, image_limits: Any = None,
                 policy: str = "the policy") -> None:
        self.tokenizer: Any = tokenizer
        #: what one request and connection may take (``--agent-max-body`` and the like)
        self.limits = limits or Limits()
        self.model = model
        #: the served model's context (prompt + completion tokens); ``None``: the engine's to check
        self.context = context
        self.max_calls = max_calls
        self.tool_parser = tool_parser
        self.reasoning_parser = reasoning_parser
        self.vision = vision
        self.image_limits = image_limits
        self.policy = policy
        self.rollouts: dict[str, Rollout] = {}
        self.server: asyncio.Server | None = None
        self.port = 0
        self.loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        """Listen on a free port of 127.0.0.1."""
        self.server = await serve(self.handle, "127.0.0.1", 0, limits=self.limits, admit=self.admit)
        self.port = self.server.sockets[0].getsockname()[1]
        self.loop = asyncio.get_running_loop()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
            self.server = None

    def base_url(self, key: str) -> str:
        return f"http://127.0.0.1:{self.port}/s/{key}/v1"

    def open(self, engine: RolloutEngine, params: SamplingParams, aborting: asyncio.Event | None = None) -> Rollout:
        """A new rollout with a fresh session key; its calls are refused once ``aborting`` is set."""
        rollout = Rollout(key="plasmid-" + secrets.token_hex(16), engine=engine, params=params, aborting=aborting)
        self.rollouts[rollout.key] = rollout
        return rollout

    def close(self, rollout: Rollout) -> None:
        """Forget ``rollout``: its key is refused from now on."""
        self.rollouts.pop(rollout.key, None)

    # ------------------------------------------------------------------ HTTP
    def route(self, request: Request) -> tuple[Any, Rollout | None] | Response:
        """The endpoint and rollout ``request`` names, from its head alone (path and headers), or
        the refusal (404, 405, 401 for an unknown key); ``(None, None)``: the model list."""
        path = request.path.split("?", 1)[0]
        key = None
        if path.startswith("/s/"):
            key, _, rest = path[3:].partition("/")
            path = "/" + rest
        if key is None:
            auth = request.headers.get("authorization", "")
            key = auth[7:].strip() if auth.lower().startswith("bearer ") else None
        if path in ("/v1/models", "/models") and request.method == "GET":
            return None, None
        route = {"/v1/chat/completions": self.chat, "/v1/completions": self.completions,
                 "/v1/responses": self.responses}.get(path)
        if route is None:
            return error_response(404, f"no route {request.method} {path[:200]} (the gateway serves "
                                       f"/v1/chat/completions, /v1/completions, /v1/responses and /v1/models)")
        if request.method != "POST":
            return error_response(405, f"{path} takes POST")
        rollout = self.rollouts.get(key or "")
        if rollout is None:
            return error_response(401, "unknown or finished session key: use the base_url and api_key of the "
                                       "session your agent function was given", "authentication_error")
        return route, rollout

    def admit(self, request: Request) -> Response | None:
        """The refusal of a request whose head already decides it (unknown key, no route), before
        its body is read: an unauthenticated client cannot make the gateway hold its body."""
        routed = self.route(request)
        if isinstance(routed, Response):
            return routed
        length, rollout = request.headers.get("content-length", ""), routed[1]
        if rollout is not None and length.isdigit() and int(length) > self.limits.max_body:
            message = (f"request body of {int(length)} bytes is over {self.limits.max_body} (--agent-max-body)")
            rollout.errors.append(message)  # named when the agent then fails
            return error_response(413, message)
        return None

    async def handle(self, request: Request) -> Response:
        routed = self.route(request)
        if isinstance(routed, Response):
            return routed
        route, rollout = routed
        if rollout is None:
            return Response(200, {"object": "list", "data": [
                {"id": self.model, "object": "model", "created": 0, "owned_by": "plasmid"}]})
        try:
            body = request.json()
            if not isinstance(body, dict):
                raise RequestError("the request body must be a JSON object")
            fields.text(body, "model")
            return await route(rollout, body)
        except RequestError as exc:
            rollout.errors.append(str(exc))
            response = error_response(exc.status, str(exc), "rate_limit_error" if exc.status == 429
                                      else "invalid_request_error")
            response.headers.update(exc.headers)
            return response
        except ValueError as exc:  # bad JSON
            rollout.errors.append(f"bad request: {exc}")
            return error_response(400, f"bad request: {exc}")
        except Exception as exc:
            rollout.errors.append(f"{type(exc).__name__}: {exc}")
            raise

    # ------------------------------------------------------------------ the endpoints
    async def chat(self, rollout: Rollout, body: dict[str, Any]) -> Response:
        fields.refuse_unsupported(body)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError("'messages' must be a non-empty list of messages")
        normalized = [normalize_message(m, f"messages[{i}]") for i, m in enumerate(messages)]
        tools = fields.tools(body)
        tool_choice = fields.tool_choice(body)
        stream, include_usage = fields.streaming(body)
        want_logprobs = requested_logprobs(body, chat=True)
        sampling = fields.sampling(body)
        text, prompt_ids, images = self.chat_prompt(rollout, normalized, tools)
        choices = await self.generate(rollout, prompt_ids, text, sampling, images)
        ident, created, model = f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), body.get("model") or self.model
        usage = usage_of(prompt_ids, choices)
        answers = []
        for choice in choices:
            content, tool_calls, reasoning = self.parse(choice, tools, tool_choice)
            answers.append((choice, content, tool_calls, reasoning, "tool_calls" if tool_calls else choice.finish))

        def logprobs_of(ids: list[int], lps: list[float]) -> dict[str, Any] | None:
            if not want_logprobs:
                return None
            return {"content": [self.logprob_entry(t, lp) for t, lp in zip(ids, lps, strict=True)], "refusal": None}

        if not stream:
            out = []
            for index, (choice, content, tool_calls, reasoning, finish) in enumerate(answers):
                message: dict[str, Any] = {"role": "assistant", "content": content}
                if tool_calls:
                    message["tool_calls"] = tool_calls
                if reasoning is not None:
                    message["reasoning_content"] = reasoning
                out.append({"index": index, "message": message, "finish_reason": finish,
                            "logprobs": logprobs_of(choice.call.completion_ids, choice.call.logprobs)})
            return Response(200, {"id": ident, "object": "chat.completion", "created": created, "model": model,
                                  "usage": usage, "choices": out})

        def chunk(index: int, delta: dict[str, Any], finish_reason: str | None = None, logprobs: Any = None) -> str:
            return json.dumps({"id": ident, "object": "chat.completion.chunk", "created": created, "model": model,
                               "choices": [{"index": index, "delta": delta, "finish_reason": finish_reason,
                                            "logprobs": logprobs}]})

        async def events() -> AsyncIterator[str]:
            for index, (choice, content, tool_calls, reasoning, finish) in enumerate(answers):
                yield chunk(index, {"role": "assistant", "content": ""})
                call = choice.call
                if tool_calls or reasoning is not None or content != choice.text:  # parsed views go whole
                    whole = logprobs_of(call.completion_ids, call.logprobs)
                    if reasoning is not None:
                        yield chunk(index, {"reasoning_content": reasoning})
                    if content:
                        yield chunk(index, {"content": content}, logprobs=whole)
                    for number, tool_call in enumerate(tool_calls):
                        yield chunk(index, {"tool_calls": [{"index": number, **tool_call}]},
                                    logprobs=whole if not content and number == 0 else None)
                else:
                    for piece, ids, lps in self.pieces(call.completion_ids, call.logprobs, choice.text):
                        yield chunk(index, {"content": piece}, logprobs=logprobs_of(ids, lps))
                yield chunk(index, {}, finish)
            if include_usage:
                yield json.dumps({"id": ident, "object": "chat.completion.chunk", "created": created,
                                  "model": model, "choices": [], "usage": usage})
            yield "[DONE]"

        return Response(200, events=events())

    async def completions(self, rollout: Rollout, body: dict[str, Any]) -> Response:
        fields.refuse_unsupported(body)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            text = prompt
            prompt_ids = self.prompt_ids(rollout, text, chat=False)
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                         for t in prompt):
            prompt_ids = list(prompt)
            text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        else:
            raise RequestError("'prompt' must be one string or one non-empty list of token ids")
        if fields.boolean(body, "echo"):
            raise RequestError("'echo' is not supported by the plasmid gateway")
        if fields.text(body, "suffix"):
            raise RequestError("'suffix' is not supported by the plasmid gateway (no fill-in-the-middle)")
        sampling = fields.sampling(body, max_tokens_names=("max_tokens",))
        best_of = fields.integer(body, "best_of", 1, fields.MAX_CHOICES)
        if best_of is not None and best_of != sampling.n:
            raise RequestError(f"'best_of' {best_of} is not supported by the plasmid gateway (it returns every "
                               f"completion it samples); leave it out or set it to n")
        stream, include_usage = fields.streaming(body)
        want = requested_logprobs(body, chat=False)
        choices = await self.generate(rollout, prompt_ids, text, sampling)
        ident, created, model = f"cmpl-{uuid.uuid4().hex}", int(time.time()), body.get("model") or self.model

        def logprobs_of(ids: list[int], lps: list[float], start: int) -> dict[str, Any] | None:
            if not want:
                return None
            tokens = [self.tokenizer.decode([t], skip_special_tokens=False) for t in ids]
            offsets, position = [], start
            for token in tokens:
                offsets.append(position)
                position += len(token)
            return {"tokens": tokens, "token_logprobs": list(lps), "top_logprobs": [{} for _ in tokens],
                    "text_offset": offsets}

        def answer(choices_part: list[dict[str, Any]], usage: dict[str, int] | None = None) -> dict[str, Any]:
            result = {"id": ident, "object": "text_completion", "created": created, "model": model,
                      "choices": choices_part}
            if usage is not None:
                result["usage"] = usage
            return result

        if not stream:
            return Response(200, answer([
                {"index": index, "text": choice.text, "finish_reason": choice.finish,
                 "logprobs": logprobs_of(choice.call.completion_ids, choice.call.logprobs, len(text))}
                for index, choice in enumerate(choices)], usage_of(prompt_ids, choices)))

        async def events() -> AsyncIterator[str]:
            for index, choice in enumerate(choices):
                call = choice.call
                for piece, ids, lps in self.pieces(call.completion_ids, call.logprobs, choice.text):
                    part = logprobs_of(ids, lps, 0)
                    if part is not None:
                        part.pop("text_offset")
                    yield json.dumps(answer([{"index": index, "text": piece, "finish_reason": None, "logprobs": part}]))
                yield json.dumps(answer([{"index": index, "text": "", "finish_reason": choice.finish,
                                          "logprobs": None}]))
            if include_usage:
                yield json.dumps(answer([], usage_of(prompt_ids, choices)))
            yield "[DONE]"

        return Response(200, events=events())

    async def responses(self, rollout: Rollout, body: dict[str, Any]) -> Response:
        """``/v1/responses``: the request as chat messages and tools (:mod:`plasmid_agent.responses`),
        one engine call as for a chat request, the answer as Responses output items."""
        request = responses.parse_request(body)
        text, prompt_ids, images = self.chat_prompt(rollout, request.messages, request.tools, request.image_fields)
        (choice,) = await self.generate(rollout, prompt_ids, text, Sampling(max_tokens=request.max_output_tokens),
                                        images)
        content, tool_calls, reasoning = self.parse(choice, request.tools, request.tool_choice)
        response = responses.response_object(body, request, self.model, content, tool_calls, choice,
                                             len(prompt_ids), reasoning)
        if not request.stream:
            return Response(200, response)
        call = choice.call
        pieces = [piece for piece, _, _ in self.pieces(call.completion_ids, call.logprobs, choice.text)]
        plain = not tool_calls and reasoning is None and content == choice.text
        return Response(200, events=responses.stream_events(response, pieces if plain else [content or ""]))

    def parse(self, choice: Choice, tools: list[dict[str, Any]] | None,
              tool_choice: str) -> tuple[str | None, list[dict[str, Any]], str | None]:
        """``(content, tool_calls, reasoning)``: the agent's view of a reply (the record keeps the
        engine's ids). Calls are read only with ``tools`` and ``tool_choice`` not ``none``;
        reasoning only with a reasoning parser (calls inside it are not calls). A parser whose
        markers may be special tokens (``reads_special_tokens``: every built-in one but pythonic)
        reads :attr:`Choice.raw`, special tokens kept, and the content and reasoning it leaves are
        shown without the tokenizer's special tokens; the others read the client's text,
        :attr:`Choice.text`, so a special token's text (a tiny model's stray ``<bos>``) never passes
        for their syntax. A reply in which they find neither calls nor reasoning, and whose text they
        leave as it is, is the client's text (a harmony reply's final answer is its message's
        body, the markers gone)."""
        calls_wanted = bool(tools) and tool_choice != "none"
        if not calls_wanted and self.reasoning_parser is None:
            return choice.text, [], None
        keeps_specials = any(getattr(parser, "reads_special_tokens", False) for parser in
                             (self.tool_parser if calls_wanted else None, self.reasoning_parser))
        source = choice.raw if keeps_specials else choice.text
        if calls_wanted:
            content, calls, reasoning = parse_reply(source, self.tool_parser, self.reasoning_parser, tools)
        else:
            parsed = parse_message(source, None, self.reasoning_parser)
            content, calls, reasoning = parsed.content, [], parsed.reasoning
        if not calls and reasoning is None and content == source:
            return choice.text, [], None
        if not keeps_specials:
            return content, calls, reasoning
        specials = special_tokens(self.tokenizer)
        return without_special(content, specials), calls, without_special(reasoning, specials)

    # ------------------------------------------------------------------ pieces
    def chat_prompt(self, rollout: Rollout, messages: list[dict[str, Any]], tools: Any,
                    image_fields: Sequence[str] = ()) -> tuple[str, list[int], list[Any]]:
        """``(text, prompt ids, images)`` of chat ``messages``: their images checked (:meth:`images_of`),
        the chat template's text with one image token per image, and the prompt ids with each expanded
        (:meth:`prompt_ids`)."""
        images = self.images_of(messages, image_fields)
        text = self.render(self.placeholders(messages) if images else messages, tools)
        vision = self.vision.inputs([image.image for image in images]) if images else None
        return text, self.prompt_ids(rollout, text, chat=True, images=images, vision=vision), images

    def images_of(self, messages: list[dict[str, Any]], image_fields: Sequence[str] = ()) -> list[Any]:
        """The image parts of ``messages`` (as :func:`normalize_message` keeps them: ``user`` and
        ``tool`` messages), in order, each checked (:func:`plasmid_torch.chat_images.check_image`:
        a data URL, or a local path with ``--agent-image-paths``; decodable; at most
        ``--agent-max-image-pixels``), at most ``--agent-max-images`` of them; each a
        :class:`~plasmid_torch.chat_images.CheckedImage`. Any failure, or an image for a policy that
        is not a vision-language model, is a 400 naming the field (and the model): ``image_fields``,
        when given, names each image's field (a ``/v1/responses`` request's ``input[k].content[j]``)."""
        found = [(f"messages[{m}].content[{p}]", part) for m, message in enumerate(messages)
                 if isinstance(message["content"], list)
                 for p, part in enumerate(message["content"]) if part.get("type") != "text"]
        if not found:
            return []
        if image_fields:
            found = [(name, part) for name, (_, part) in zip(image_fields, found, strict=True)]
        if self.vision is None:
            raise RequestError(f"'{found[0][0]}' is an image, but the model {self.model!r} ({self.policy}) is not "
                               f"a vision-language model; send text only")
        from plasmid_torch.chat_images import check_count, check_image

        try:
            check_count(len(found), "'input'" if image_fields else "'messages'", self.image_limits)
            return [check_image(part, f"'{where}.image_url'", self.image_limits) for where, part in found]
        except ValueError as error:
            hint = {"images, over": " (--agent-max-images)", "pixels is over": " (--agent-max-image-pixels)",
                    "local files are not read": " (or start the run with --agent-image-paths)"}
            raise RequestError(str(error) + next((flag for key, flag in hint.items() if key in str(error)), "")) \
                from None

    @staticmethod
    def placeholders(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``messages`` with each image part replaced by ``{"type": "image"}``, the place of an image as
        chat templates take it (one image token each; :meth:`prompt_ids` expands them)."""
        return [{**message, "content": [part if part.get("type") == "text" else {"type": "image"}
                                        for part in message["content"]]}
                if isinstance(message["content"], list) else message for message in messages]

    def render(self, messages: list[dict[str, Any]], tools: Any) -> str:
        """The chat template's text for ``messages`` with the generation prompt."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise RequestError("the model's tokenizer has no chat template, so /v1/chat/completions cannot "
                               "render messages; give the model one or use /v1/completions")
        try:
            text = self.tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                                      tokenize=False)
        except Exception as exc:  # noqa: BLE001 - a template error is the request's problem
            raise RequestError(f"the chat template could not render the messages: "
                               f"{type(exc).__name__}: {exc}") from None
        if not isinstance(text, str):
            raise RequestError(f"the chat template rendered {type(text).__name__}, not text")
        return text

    def encode(self, text: str, *, special: bool) -> list[int]:
        try:
            return list(self.tokenizer.encode(text, add_special_tokens=special))
        except Exception as exc:  # noqa: BLE001 - text the tokenizer cannot encode is the request's problem
            raise RequestError(f"the tokenizer cannot encode {text[:60]!r}: {type(exc).__name__}: {exc}") from None

    def prompt_ids(self, rollout: Rollout, text: str, *, chat: bool, images: Sequence[Any] = (),
                   vision: Any = None) -> list[int]:
        """The prompt ids of ``text``: the longest earlier call whose prompt and completion text
        ``text`` starts with (and whose images are the first of ``images``), its ids and the rest
        encoded alone; else ``text`` encoded (chat text already holds its special tokens; a
        completion prompt gets the tokenizer's). With ``images`` (:meth:`images_of`; ``vision`` their
        model inputs) the image tokens of the encoded text are expanded to each image's token count;
        a text whose image tokens do not match the images is a :class:`RequestError`."""
        parts = [image.part for image in images]
        best: Call | None = None
        for call in rollout.calls:
            anchor = call.prompt_text + call.completion_text
            if text.startswith(anchor) and call.images == parts[:len(call.images)] and (
                    best is None or len(anchor) >= len(best.prompt_text + best.completion_text)):
                best = call
        rest = text if best is None else text[len(best.prompt_text) + len(best.completion_text):]
        ids = self.encode(rest, special=not chat and best is None) if best is None or rest else []
        if self.vision is not None and chat:
            counts = self.vision.counts(vision) if vision is not None else []
            try:
                ids = self.vision.expand(ids, counts[len(best.images) if best is not None else 0:])
            except ValueError as error:
                raise RequestError(f"'messages': {error} (is an image token's text in a message?)") from None
        return ids if best is None else best.full_ids + ids

    def completion_text(self, prompt_ids: list[int], completion_ids: list[int]) -> str:
        """The completion as text in the context of its prompt (special tokens kept), so that a
        tokenizer that drops a leading space when decoding a piece alone still matches."""
        decode = self.tokenizer.decode
        before = decode(prompt_ids, skip_special_tokens=False)
        whole = decode(prompt_ids + completion_ids, skip_special_tokens=False)
        if whole.startswith(before):
            return str(whole[len(before):])
        return str(decode(completion_ids, skip_special_tokens=False))

    def _reserve(self, rollout: Rollout, n: int) -> None:
        """Refuse a request of ``n`` engine calls that would take ``rollout`` past ``max_calls``."""
        if self.max_calls is not None and rollout.started + n > self.max_calls:
            rollout.capped = True
            raise RequestError(f"this agent session has made {rollout.started} model calls and the cap is "
                               f"{self.max_calls} (--agent-max-calls {self.max_calls}); end the session (its samples "
                               f"so far are kept)", status=429, headers=NO_RETRY)

    async def generate(self, rollout: Rollout, prompt_ids: list[int], text: str, sampling: Sampling = Sampling(),
                       images: Sequence[Any] = ()) -> list[Choice]:
        """Run ``sampling.n`` engine calls for ``rollout`` on ``prompt_ids`` (the prompt's ``text``),
        cut each at the first of ``sampling.stops``, and record them, in choice order. A prompt with
        ``images`` (:meth:`images_of`) goes to the engine's ``generate_with_images`` with what the
        engine's ``images`` makes of them (:func:`plasmid_torch.chat_images.engine_images`); an engine
        that takes no images is a 400 naming it."""
        if rollout.aborting is not None and rollout.aborting.is_set():
            rollout.aborted = True
        if rollout.aborted:
            raise RequestError("plasmid aborted this rollout (the step is complete); stop the agent")
        budget = rollout.params.max_new_tokens
        if sampling.max_tokens is not None:
            budget = min(budget, sampling.max_tokens)
        if self.context is not None and len(prompt_ids) + budget > self.context:
            raise RequestError(ContextLengthError(self.context, len(prompt_ids), budget).openai_message)
        self._reserve(rollout, sampling.n)
        engine: Any = rollout.engine
        vision = None
        if images:
            from plasmid_torch.chat_images import engine_images

            try:
                vision = engine_images(engine, [image.part for image in images])
            except (ValueError, UsageError) as error:         # one line naming the engine
                raise RequestError(f"'messages' holds images, but {error}") from None
        params = [replace(rollout.params, max_new_tokens=budget, seed=rollout.next_seed(), stop=sampling.stops)
                  for _ in range(sampling.n)]
        results = await asyncio.gather(*(engine.generate_with_images(list(prompt_ids), vision, p) if images
                                         else engine.generate(list(prompt_ids), p) for p in params),
                                       return_exceptions=True)
        for result in results:
            if isinstance(result, ContextLengthError):  # the engine knew a shorter context than the gateway
                raise RequestError(result.openai_message) from result
            if isinstance(result, asyncio.CancelledError):
                raise result
            if isinstance(result, BaseException):
                raise RequestError(f"the rollout engine failed: {type(result).__name__}: {result}",
                                   status=500) from result
        outputs: list[GenerationOutput] = list(results)  # type: ignore[arg-type]
        if any(output.status == Status.ABORTED for output in outputs):
            rollout.aborted = True
            raise RequestError("plasmid aborted this rollout (the step is complete); stop the agent")
        choices = [self._choice(list(prompt_ids), text, output, sampling.stops) for output in outputs]
        for choice in choices:
            choice.call.images = [image.part for image in images]
        rollout.calls.extend(choice.call for choice in choices)
        return choices

    def _choice(self, prompt_ids: list[int], text: str, output: GenerationOutput, stops: tuple[str, ...]) -> Choice:
        """The recorded call and answer text of one engine output, cut at a stop string."""
        ids, logprobs, status = list(output.token_ids), list(output.logprobs), output.status
        shown = self.tokenizer.decode(ids, skip_special_tokens=True)
        cut = cut_at_stop(lambda part: self.tokenizer.decode(part, skip_special_tokens=True), ids, stops)
        if cut is not None:
            ids, logprobs, status, shown = ids[:cut.kept], logprobs[:cut.kept], Status.COMPLETED, cut.text
        raw = self.tokenizer.decode(ids, skip_special_tokens=False)
        if cut is not None and (at := raw.rfind(cut.stop)) >= 0:
            raw = raw[:at]
        call = Call(prompt_ids=prompt_ids, completion_ids=ids, logprobs=logprobs, status=status,
                    weight_version=output.weight_version, prompt_text=text,
                    completion_text=self.completion_text(prompt_ids, ids))
        return Choice(call, shown, finish_reason(status), raw)

    def logprob_entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        token = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return {"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": []}

    def pieces(self, ids: list[int], lps: list[float], shown: str) -> list[tuple[str, list[int], list[float]]]:
        """The completion ``ids`` in at most :data:`MAX_STREAM_CHUNKS` streamed pieces: ``(text
        delta, token ids, log-probs)``; the deltas join to ``shown``, the text the client is shown
        (the decoded completion, or its part before a stop string: no delta goes past it); a piece
        whose text is not final yet, such as half a UTF-8 character, waits for the next."""
        if not ids:
            return []
        step = -(-len(ids) // MAX_STREAM_CHUNKS)
        result, sent = [], 0
        for start in range(0, len(ids), step):
            end = min(len(ids), start + step)
            text = shown if end == len(ids) else self.tokenizer.decode(ids[:end], skip_special_tokens=True)
            text = text[:len(shown)]
            delta = ""
            if shown.startswith(text) and len(text) >= sent:
                delta, sent = text[sent:], len(text)
            result.append((delta, ids[start:end], lps[start:end]))
        return result


def normalize_message(message: Any, where: str = "messages[0]") -> dict[str, Any]:
    """A chat message as the template sees it: ``role`` and ``content``, and ``tool_calls``
    (arguments as JSON text), ``tool_call_id``, ``name`` when given; other fields (``refusal``,
    ``audio``, ...) are dropped. ``where`` names it in errors. A list of text parts is joined into
    one text; a ``user`` or ``tool`` message's list that holds ``image_url`` parts stays a list of
    ``{"type": "text", "text": ...}`` and the image parts as given (read by :meth:`Gateway.images_of`)."""
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise RequestError(f"'{where}' must be an object with a string 'role', got {str(message)[:80]}")
    content = message.get("content")
    if isinstance(content, list):
        images_allowed = message["role"] in ("user", "tool")
        parts: list[dict[str, Any]] = []
        for number, part in enumerate(content):
            if images_allowed and isinstance(part, dict) and part.get("type") == "image_url":
                parts.append(part)
                continue
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text", ""), str):
                kinds = "text and image_url parts" if images_allowed else "text parts ({'type': 'text', 'text': ...})"
                raise RequestError(f"'{where}.content[{number}]': {message['role']} message parts must be {kinds}, "
                                   f"got {str(part)[:80]}")
            parts.append({"type": "text", "text": part.get("text", "")})
        content = parts if any(part["type"] != "text" for part in parts) else "".join(p["text"] for p in parts)
    elif content is not None and not isinstance(content, str):
        raise RequestError(f"'{where}.content' must be text or a list of text parts, got {type(content).__name__}")
    result: dict[str, Any] = {"role": message["role"], "content": content if content is not None else ""}
    if message.get("tool_calls"):
        if not isinstance(message["tool_calls"], list):
            raise RequestError(f"'{where}.tool_calls' must be a list")
        calls = []
        for number, call in enumerate(message["tool_calls"]):
            if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
                raise RequestError(f"'{where}.tool_calls[{number}]' must be an object with a 'function'")
            function = dict(call["function"])
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                try:
                    function["arguments"] = json.loads(arguments)
                except ValueError:
                    pass
            calls.append({"id": call.get("id"), "type": call.get("type", "function"), "function": function})
        result["tool_calls"] = calls
    for name in ("tool_call_id", "name"):
        if message.get(name) is not None:
            result[name] = message[name]
    return result


def requested_logprobs(body: dict[str, Any], *, chat: bool) -> bool:
    """Whether the request asks for log-probs, its ``top_logprobs`` checked as OpenAI checks it
    (chat: ``logprobs`` a boolean, ``top_logprobs`` an integer 0-20 that needs ``logprobs: true``;
    completions: ``logprobs`` an integer 0-5); a bad value is a :class:`RequestError`. The top-k
    lists the gateway returns are empty (see the module docstring)."""
    if not chat:
        value = body.get("logprobs")
        if value is None or value is False:
            return False
        fields.integer(body, "logprobs", 0, 5)
        return True
    wanted = fields.boolean(body, "logprobs")
    if fields.integer(body, "top_logprobs", 0, 20) is not None and not wanted:
        raise RequestError("'top_logprobs' needs 'logprobs': true")
    return bool(wanted)


def finish_reason(status: Status) -> str:
    return "length" if status == Status.TRUNCATED else "stop"


def usage_of(prompt_ids: list[int], choices: list[Choice]) -> dict[str, int]:
    """OpenAI's ``usage``: the prompt once, the completions of every choice summed."""
    prompt, completion = len(prompt_ids), sum(len(choice.call.completion_ids) for choice in choices)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
