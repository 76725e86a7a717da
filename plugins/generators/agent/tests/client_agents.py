"""Agents written with real client libraries, run by ``plasmid train --generate agent`` in
``test_agent_clients_train.py`` on the quickstart's tiny model.

The tiny model's alphabet is digits and ``+=>``: it cannot write the JSON of a Hermes tool call.
So this module registers a tool parser for it, ``tiny-digits`` (``--tool-parser tiny-digits``; the
run loads the module as a plugin with ``--plugins FILE`` so that the name exists at start-up):
``>`` followed by a digit ``d`` is a call of ``double`` with ``{"n": d}``. The untrained model
writes that now and then, and the clients run their tool on it as they would on any model's call.

Every client gets :func:`tapped_client`: an ``AsyncOpenAI`` whose transport asks each chat call
for ``logprobs`` and writes, for every choice the gateway answered, the tokens and log-probs the
client was sent to ``$PLASMID_CLIENT_LOG`` (one JSON line per choice), so that the test compares
them with the samples plasmid trained on.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from openai import AsyncOpenAI

try:  # the HTTP library the installed openai client is built on: httpx2 (openai's own fork), else httpx
    import httpx2 as httpx
except ImportError:
    import httpx

from plasmid_serving.parsers import TOOL_PARSERS, CallSpan, ToolCall, ToolParser

#: the tools the agents offer, in OpenAI's form
TOOLS = [{"type": "function", "function": {"name": "double", "description": "twice a digit",
                                           "parameters": {"type": "object", "properties": {"n": {"type": "integer"}},
                                                          "required": ["n"]}}}]


class TinyDigitCalls(ToolParser):
    """``>d`` is a call ``double(n=d)``: a syntax the quickstart's digit-only model can write."""

    name = "tiny-digits"

    def spans(self, text: str, tools: list[dict[str, Any]] | None = None) -> list[CallSpan]:
        return [CallSpan(m.start(), m.end(), (ToolCall("double", {"n": int(m.group(1))}),))
                for m in re.finditer(r">(\d)", text)]


if "tiny-digits" not in TOOL_PARSERS.names():  # the module may be loaded twice in one process
    TOOL_PARSERS.register("tiny-digits", TinyDigitCalls, origin=__file__)


def double(n: int) -> str:
    """Twice ``n`` (the tool every agent here offers)."""
    return str(2 * int(n))


class Tap(httpx.AsyncBaseTransport):
    """An httpx transport that asks every ``/chat/completions`` call for ``logprobs`` and logs each
    choice's token strings and log-probs (plain and streamed answers) to ``$PLASMID_CLIENT_LOG``."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        chat = request.method == "POST" and request.url.path.endswith("/chat/completions")
        if chat:
            body = json.loads(await request.aread())
            body["logprobs"] = True
            headers = [(k, v) for k, v in request.headers.items() if k.lower() != "content-length"]
            request = httpx.Request(request.method, request.url, headers=headers, json=body)
        response = await self.inner.handle_async_request(request)
        if not chat or response.status_code != 200:
            return response
        content = await response.aread()
        log_choices(content.decode())
        headers = [(k, v) for k, v in response.headers.items()
                   if k.lower() not in ("content-length", "transfer-encoding")]
        return httpx.Response(response.status_code, headers=headers, content=content, request=request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def log_choices(text: str) -> None:
    """Append each choice of a chat answer (JSON, or server-sent events) as ``{"tokens", "logprobs"}``."""
    if text.lstrip().startswith("{"):
        choices = {c["index"]: c["logprobs"]["content"] for c in json.loads(text)["choices"]}
    else:
        choices = {}
        for line in text.splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for c in json.loads(line[6:]).get("choices", []):
                    choices.setdefault(c["index"], []).extend((c.get("logprobs") or {}).get("content") or [])
    with open(os.environ["PLASMID_CLIENT_LOG"], "a") as log:
        for entries in choices.values():
            log.write(json.dumps({"tokens": [e["token"] for e in entries],
                                  "logprobs": [e["logprob"] for e in entries]}) + "\n")


def tapped_client(session: Any) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0,
                       http_client=httpx.AsyncClient(transport=Tap(), timeout=120))


async def openai_tools(session):
    """The ``openai`` client: ``n=2`` choices with ``tools`` and a ``stop`` string; each choice that
    called ``double`` gets the tool's answer and a streamed follow-up call."""
    client = tapped_client(session)
    first = await client.chat.completions.create(model=session.model, messages=session.messages, tools=TOOLS, n=2,
                                                 stop=["=>"], logprobs=True, max_tokens=12)
    correct, calls, stops = 0.0, 0.0, 0.0
    for choice in first.choices:
        message = choice.message
        stops += float(choice.finish_reason == "stop" and "=>" not in (message.content or ""))
        text = message.content or ""
        if message.tool_calls:
            calls += len(message.tool_calls)
            answers = [{"role": "tool", "tool_call_id": call.id,
                        "content": double(**json.loads(call.function.arguments))} for call in message.tool_calls]
            stream = await client.chat.completions.create(
                model=session.model, messages=[*session.messages, message.model_dump(exclude_none=True), *answers],
                tools=TOOLS, stop=["=>"], logprobs=True, max_tokens=12, stream=True)
            text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
        correct += float(text.strip() == str(session.label)) / len(first.choices)
    return {"correct": correct, "tool_calls": calls, "stops": stops}


def counted_double(counter: list[int]):
    """:func:`double` as a tool that counts its runs in ``counter[0]``."""

    def double(n: int) -> str:
        """Twice a digit."""
        counter[0] += 1
        return str(2 * int(n))

    return double


def _sdk_agent(session, model_class: str, counter: list[int]):
    import agents

    agents.set_tracing_disabled(True)
    model = getattr(agents, model_class)(model=session.model, openai_client=tapped_client(session))
    return agents.Agent(name="tiny", model=model, tools=[agents.function_tool(counted_double(counter))],
                        model_settings=agents.ModelSettings(max_tokens=12))


async def sdk_chat(session):
    """The OpenAI Agents SDK through ``OpenAIChatCompletionsModel``, one function tool, streamed."""
    import agents

    counter = [0]
    result = agents.Runner.run_streamed(_sdk_agent(session, "OpenAIChatCompletionsModel", counter),
                                        session.messages[-1]["content"], max_turns=4)
    try:
        async for _ in result.stream_events():
            pass
    except agents.exceptions.MaxTurnsExceeded:  # the untrained model kept calling the tool
        return {"correct": 0.0, "tool_calls": float(counter[0])}
    return {"correct": float(str(result.final_output).strip() == str(session.label)), "tool_calls": float(counter[0])}


async def sdk_responses(session):
    """The OpenAI Agents SDK through its default ``OpenAIResponsesModel`` (``/v1/responses``). The SDK
    raises on a response cut by ``max_output_tokens`` (status ``incomplete``), as it does with OpenAI's
    API; the agent scores that 0, as agent code written for a real model does."""
    import agents

    counter = [0]
    try:
        result = await agents.Runner.run(_sdk_agent(session, "OpenAIResponsesModel", counter),
                                         session.messages[-1]["content"], max_turns=4)
    except (agents.exceptions.ModelBehaviorError, agents.exceptions.MaxTurnsExceeded):
        return {"correct": 0.0, "tool_calls": float(counter[0])}
    return {"correct": float(str(result.final_output).strip() == str(session.label)), "tool_calls": float(counter[0])}


async def pydantic_ai_agent(session):
    """A PydanticAI agent (``pydantic-ai-slim[openai]``) on ``OpenAIChatModel``, one tool. PydanticAI
    answers an empty reply with an English retry prompt that the digit-only tokenizer cannot encode,
    so retries are off (``retries=0``) and a reply it rejects scores 0."""
    from pydantic_ai import Agent
    from pydantic_ai.exceptions import UnexpectedModelBehavior
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    counter = [0]
    model = OpenAIChatModel(session.model, provider=OpenAIProvider(openai_client=tapped_client(session)))
    agent = Agent(model, tools=[counted_double(counter)], model_settings={"max_tokens": 12}, retries=0)
    try:
        result = await agent.run(session.messages[-1]["content"])
    except UnexpectedModelBehavior:
        return {"correct": 0.0, "tool_calls": float(counter[0])}
    return {"correct": float(str(result.output).strip() == str(session.label)), "tool_calls": float(counter[0])}


def square(colour: str) -> str:
    """A tool that draws a 32x32 square of ``colour`` (a name of ``--task colours``) and answers it as
    a PNG data URL."""
    import base64
    import io

    from PIL import Image
    from plasmid_tasks.colours import COLOURS

    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), COLOURS[colour]).save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


async def colours_with_square(session):
    """For ``--task colours`` on the tiny VLM: the prompt (an image and its question) as it is, with
    ``n=2``; then, for the first choice, the agent runs its ``square`` tool itself (the tiny model
    cannot write a call) and sends the tool's image back in a ``tool`` message, as an OpenAI agent
    sends a tool's image result, for a second answer. Reward: the first choice named the colour."""
    client = tapped_client(session)
    first = await client.chat.completions.create(model=session.model, messages=session.messages, n=2,
                                                 logprobs=True, max_tokens=6)
    reply = first.choices[0].message
    called = {"id": "call_0", "type": "function", "function": {"name": "square", "arguments": '{"colour": "red"}'}}
    tool = {"role": "tool", "tool_call_id": "call_0",
            "content": [{"type": "text", "text": "square:"},
                        {"type": "image_url", "image_url": {"url": square("red")}}]}
    await client.chat.completions.create(
        model=session.model, logprobs=True, max_tokens=6,
        messages=[*session.messages, {"role": "assistant", "content": reply.content or "", "tool_calls": [called]},
                  tool])
    return {"correct": float((reply.content or "").strip() == str(session.label))}
