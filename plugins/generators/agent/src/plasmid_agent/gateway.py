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

Sampling: the run's ``--temperature``, ``--top-p``, ``--top-k`` and stop tokens apply to every
call (the request's are ignored: the trainer scores log-probs at the run's temperature);
``max_tokens`` / ``max_completion_tokens`` is honoured up to ``--max-new-tokens``. A call whose prompt
and completion budget do not fit the model's context is refused as vLLM refuses it: HTTP 400,
``This model's maximum context length is N tokens. However, you requested M tokens (P in the
messages, K in the completion). ...`` (:class:`~plasmid.errors.ContextLengthError`), whether the
gateway knows the context or the engine refuses the call. ``n`` must be
1; ``stop`` strings are refused (the engine stops on token ids). ``logprobs`` are the engine's
log-prob of each sampled token, exactly. ``top_logprobs`` (chat: 0-20, with ``logprobs: true``;
completions: ``logprobs`` 0-5) is checked as OpenAI does, but its lists are always empty: the
engine protocol (:meth:`plasmid.protocols.RolloutEngine.generate`) returns only the sampled
token's log-prob, no top-k alternatives, and the gateway does not make up ones it was not given.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

from plasmid.errors import ContextLengthError
from plasmid.protocols import RolloutEngine, Tokenizer
from plasmid.types import GenerationOutput, SamplingParams, Status
from plasmid_agent.httpserver import Limits, Request, Response, error_response, serve
from plasmid_agent.recorder import Call
from plasmid_agent.toolcalls import parse_tool_calls

#: At most this many content chunks per streamed response (longer responses put several tokens in one).
MAX_STREAM_CHUNKS = 256


class RequestError(Exception):
    """A request the gateway refuses (HTTP 400), with the reason the client is shown."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Rollout:
    """One agent rollout: the engine and sampling parameters its calls use, and its recorded calls
    (in the order they finished).

    :ivar aborted: a call came back aborted, or the step's ``aborting`` event was set (the driver
        is ending the step); later calls are refused.
    :ivar aborting: the step's abort event (:attr:`plasmid.protocols.RolloutView.aborting`), or None.
    :ivar errors: what the gateway refused or failed, for the message when the agent then fails.
    """

    key: str
    engine: RolloutEngine
    params: SamplingParams
    calls: list[Call] = field(default_factory=list)
    aborted: bool = False
    errors: list[str] = field(default_factory=list)
    started: int = 0
    aborting: asyncio.Event | None = None

    def next_seed(self) -> int | None:
        """A distinct, reproducible seed per call (the rollout's seed, then offsets)."""
        number = self.started
        self.started += 1
        if self.params.seed is None:
            return None
        return (self.params.seed + number * 7_919) % (2**31 - 1)


class Gateway:
    """The HTTP server and the rollouts it serves. Start it with :meth:`start` on the event loop
    the engines are called from; :meth:`open` a :class:`Rollout` per agent run."""

    def __init__(self, tokenizer: Tokenizer, model: str = "plasmid", context: int | None = None,
                 limits: Limits | None = None) -> None:
        self.tokenizer: Any = tokenizer
        #: what one request and connection may take (``--agent-max-body`` and the like)
        self.limits = limits or Limits()
        self.model = model
        #: the served model's context (prompt + completion tokens); ``None``: the engine's to check
        self.context = context
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
        route = {"/v1/chat/completions": self.chat, "/v1/completions": self.completions}.get(path)
        if route is None:
            return error_response(404, f"no route {request.method} {path[:200]} (the gateway serves "
                                       f"/v1/chat/completions, /v1/completions and /v1/models)")
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
            return await route(rollout, body)
        except RequestError as exc:
            rollout.errors.append(str(exc))
            return error_response(exc.status, str(exc))
        except ValueError as exc:  # bad JSON
            rollout.errors.append(f"bad request: {exc}")
            return error_response(400, f"bad request: {exc}")
        except Exception as exc:
            rollout.errors.append(f"{type(exc).__name__}: {exc}")
            raise

    # ------------------------------------------------------------------ the two endpoints
    async def chat(self, rollout: Rollout, body: dict[str, Any]) -> Response:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError("'messages' must be a non-empty list")
        tools = body.get("tools") or None
        text = self.render([normalize_message(m) for m in messages], tools)
        prompt_ids = self.prompt_ids(rollout, text, chat=True)
        requested_logprobs(body, chat=True)  # a bad request is refused before the engine runs
        call, output = await self.generate(rollout, body, prompt_ids, text)
        content = self.tokenizer.decode(call.completion_ids, skip_special_tokens=True)
        tool_calls: list[dict[str, Any]] = []
        if tools:
            content, tool_calls = parse_tool_calls(content)
        finish = "tool_calls" if tool_calls else finish_reason(output.status)
        logprobs = None
        if requested_logprobs(body, chat=True):
            logprobs = {"content": [self.logprob_entry(t, lp) for t, lp in zip(call.completion_ids, call.logprobs,
                                                                                 strict=True)], "refusal": None}
        ident, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        usage = usage_of(call)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if tool_calls:
            message["tool_calls"] = tool_calls
        if not body.get("stream"):
            return Response(200, {"id": ident, "object": "chat.completion", "created": created,
                                  "model": body.get("model") or self.model, "usage": usage,
                                  "choices": [{"index": 0, "message": message, "finish_reason": finish,
                                               "logprobs": logprobs}]})
        model = body.get("model") or self.model
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        def chunk(delta: dict[str, Any], finish_reason: str | None = None, logprobs: Any = None) -> str:
            return json.dumps({"id": ident, "object": "chat.completion.chunk", "created": created, "model": model,
                               "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason,
                                            "logprobs": logprobs}]})

        async def events() -> AsyncIterator[str]:
            yield chunk({"role": "assistant", "content": ""})
            if tool_calls:
                if content:
                    yield chunk({"content": content}, logprobs=logprobs)
                for index, tool_call in enumerate(tool_calls):
                    yield chunk({"tool_calls": [{"index": index, **tool_call}]},
                                logprobs=logprobs if not content and index == 0 else None)
            else:
                for piece, ids, lps in self.pieces(call):
                    entries = [self.logprob_entry(t, lp) for t, lp in zip(ids, lps, strict=True)]
                    yield chunk({"content": piece}, logprobs={"content": entries, "refusal": None} if logprobs
                                else None)
            yield chunk({}, finish)
            if include_usage:
                yield json.dumps({"id": ident, "object": "chat.completion.chunk", "created": created,
                                  "model": model, "choices": [], "usage": usage})
            yield "[DONE]"

        return Response(200, events=events())

    async def completions(self, rollout: Rollout, body: dict[str, Any]) -> Response:
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
        if body.get("echo"):
            raise RequestError("'echo' is not supported by the plasmid gateway")
        want = requested_logprobs(body, chat=False)
        call, output = await self.generate(rollout, body, prompt_ids, text)
        completion = self.tokenizer.decode(call.completion_ids, skip_special_tokens=True)
        logprobs = None
        if want:
            tokens = [self.tokenizer.decode([t], skip_special_tokens=False) for t in call.completion_ids]
            offsets, position = [], len(text)
            for token in tokens:
                offsets.append(position)
                position += len(token)
            logprobs = {"tokens": tokens, "token_logprobs": list(call.logprobs),
                        "top_logprobs": [{} for _ in tokens], "text_offset": offsets}
        ident, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        model = body.get("model") or self.model
        finish = finish_reason(output.status)
        if not body.get("stream"):
            return Response(200, {"id": ident, "object": "text_completion", "created": created, "model": model,
                                  "usage": usage_of(call),
                                  "choices": [{"index": 0, "text": completion, "finish_reason": finish,
                                               "logprobs": logprobs}]})

        async def events() -> AsyncIterator[str]:
            for piece, ids, lps in self.pieces(call):
                part = None
                if logprobs is not None:
                    part = {"tokens": [self.tokenizer.decode([t], skip_special_tokens=False) for t in ids],
                            "token_logprobs": list(lps), "top_logprobs": [{} for _ in ids]}
                yield json.dumps({"id": ident, "object": "text_completion", "created": created, "model": model,
                                  "choices": [{"index": 0, "text": piece, "finish_reason": None, "logprobs": part}]})
            yield json.dumps({"id": ident, "object": "text_completion", "created": created, "model": model,
                              "choices": [{"index": 0, "text": "", "finish_reason": finish, "logprobs": None}]})
            if (body.get("stream_options") or {}).get("include_usage"):
                yield json.dumps({"id": ident, "object": "text_completion", "created": created, "model": model,
                                  "choices": [], "usage": usage_of(call)})
            yield "[DONE]"

        return Response(200, events=events())

    # ------------------------------------------------------------------ pieces
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

    def prompt_ids(self, rollout: Rollout, text: str, *, chat: bool) -> list[int]:
        """The prompt ids of ``text``: the longest earlier call whose prompt and completion text
        ``text`` starts with, its ids and the rest encoded alone; else ``text`` encoded (chat text
        already holds its special tokens; a completion prompt gets the tokenizer's)."""
        best: Call | None = None
        for call in rollout.calls:
            anchor = call.prompt_text + call.completion_text
            if text.startswith(anchor) and (best is None or len(anchor) >= len(best.prompt_text +
                                                                                best.completion_text)):
                best = call
        if best is None:
            return self.encode(text, special=not chat)
        rest = text[len(best.prompt_text) + len(best.completion_text):]
        return best.full_ids + (self.encode(rest, special=False) if rest else [])

    def completion_text(self, prompt_ids: list[int], completion_ids: list[int]) -> str:
        """The completion as text in the context of its prompt (special tokens kept), so that a
        tokenizer that drops a leading space when decoding a piece alone still matches."""
        decode = self.tokenizer.decode
        before = decode(prompt_ids, skip_special_tokens=False)
        whole = decode(prompt_ids + completion_ids, skip_special_tokens=False)
        if whole.startswith(before):
            return str(whole[len(before):])
        return str(decode(completion_ids, skip_special_tokens=False))

    async def generate(self, rollout: Rollout, body: dict[str, Any], prompt_ids: list[int],
                       text: str) -> tuple[Call, GenerationOutput]:
        """Run one engine call for ``rollout`` and record it."""
        if rollout.aborting is not None and rollout.aborting.is_set():
            rollout.aborted = True
        if rollout.aborted:
            raise RequestError("plasmid aborted this rollout (the step is complete); stop the agent")
        if body.get("n", 1) not in (1, None):
            raise RequestError("'n' must be 1 (call again for another response)")
        if body.get("stop"):
            raise RequestError("'stop' sequences are not supported by the plasmid gateway (the engine stops on "
                               "the model's stop tokens)")
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        budget = rollout.params.max_new_tokens
        if limit is not None:
            if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
                raise RequestError(f"max_tokens must be a positive integer, got {limit!r}")
            budget = min(budget, limit)
        if self.context is not None and len(prompt_ids) + budget > self.context:
            raise RequestError(ContextLengthError(self.context, len(prompt_ids), budget).openai_message)
        params = replace(rollout.params, max_new_tokens=budget, seed=rollout.next_seed())
        try:
            output = await rollout.engine.generate(list(prompt_ids), params)
        except ContextLengthError as exc:  # the engine knew a shorter context than the gateway
            raise RequestError(exc.openai_message) from exc
        except Exception as exc:
            raise RequestError(f"the rollout engine failed: {type(exc).__name__}: {exc}", status=500) from exc
        if output.status == Status.ABORTED:
            rollout.aborted = True
            raise RequestError("plasmid aborted this rollout (the step is complete); stop the agent")
        completion = list(output.token_ids)
        call = Call(prompt_ids=list(prompt_ids), completion_ids=completion, logprobs=list(output.logprobs),
                    status=output.status, weight_version=output.weight_version, prompt_text=text,
                    completion_text=self.completion_text(list(prompt_ids), completion))
        rollout.calls.append(call)
        return call, output

    def logprob_entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        token = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return {"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": []}

    def pieces(self, call: Call) -> list[tuple[str, list[int], list[float]]]:
        """The completion in at most :data:`MAX_STREAM_CHUNKS` streamed pieces: ``(text delta,
        token ids, log-probs)``; the deltas join to the whole decoded completion (a piece whose
        text is not final yet, such as half a UTF-8 character, waits for the next)."""
        ids, lps = call.completion_ids, call.logprobs
        if not ids:
            return []
        whole = self.tokenizer.decode(ids, skip_special_tokens=True)
        step = -(-len(ids) // MAX_STREAM_CHUNKS)
        result, sent = [], 0
        for start in range(0, len(ids), step):
            end = min(len(ids), start + step)
            text = whole if end == len(ids) else self.tokenizer.decode(ids[:end], skip_special_tokens=True)
            delta = ""
            if whole.startswith(text) and len(text) >= sent:
                delta, sent = text[sent:], len(text)
            result.append((delta, ids[start:end], lps[start:end]))
        return result


def normalize_message(message: Any) -> dict[str, Any]:
    """A chat message as the template sees it: ``role`` and text ``content`` (a list of text parts
    joined), and ``tool_calls`` (arguments as JSON text), ``tool_call_id``, ``name`` when given;
    other fields (``refusal``, ``audio``, ...) are dropped."""
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise RequestError(f"each message must be an object with a 'role', got {str(message)[:80]}")
    content = message.get("content")
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise RequestError("message content parts must be text parts ({'type': 'text', 'text': ...})")
            texts.append(str(part.get("text", "")))
        content = "".join(texts)
    elif content is not None and not isinstance(content, str):
        raise RequestError(f"message content must be text, got {type(content).__name__}")
    result: dict[str, Any] = {"role": message["role"], "content": content if content is not None else ""}
    if message.get("tool_calls"):
        calls = []
        for call in message["tool_calls"]:
            function = dict(call.get("function") or {})
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

    def integer(name: str, value: Any, high: int) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= high:
            raise RequestError(f"'{name}' must be an integer from 0 to {high}, got {value!r}")
        return value

    if not chat:
        value = body.get("logprobs")
        if value is None or value is False:
            return False
        integer("logprobs", value, 5)
        return True
    wanted = body.get("logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise RequestError(f"'logprobs' must be true or false, got {wanted!r}")
    top = body.get("top_logprobs")
    if top is not None:
        integer("top_logprobs", top, 20)
        if not wanted:
            raise RequestError("'top_logprobs' needs 'logprobs': true")
    return bool(wanted)


def finish_reason(status: Status) -> str:
    return "length" if status == Status.TRUNCATED else "stop"


def usage_of(call: Call) -> dict[str, int]:
    prompt, completion = len(call.prompt_ids), len(call.completion_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
