"""The verifiers v1 harness that plasmid-verifiers runs a v1 taskset's agent with: a chat loop in
this process (no program, no container), so the plasmid engine answers every model call.

verifiers v1 resolves a harness by id as an installed top-level module that exports one
``Harness`` subclass in ``__all__`` (``verifiers.v1.utils.loaders``); this module is that id,
``plasmid_verifiers_harness``. verifiers' own contract for a harness (``Harness.launch``) is that
every model call goes through the rollout's interception ``endpoint`` with its ``secret``; the
interception records the call on the trace and relays it to the model client (plasmid-agent's
gateway, which generates with the engine and records the exact tokens). A loop run in-process
returns a synthetic success ``ProgramResult``, as the contract allows.

The loop: the system prompt (when the task has one) and the prompt, then model calls until a reply
asks for no tool. The task's tools are its MCP tool servers (``mcp_urls``, ``<server>_<tool>`` as
verifiers' own chat loop advertises them, a server named ``""`` bare); each call's result is the
next ``tool`` message. A call to an unknown tool or with arguments that are not a JSON object is
answered with an error message, so the model can recover. The conversation ends when a reply calls
no tool, when the interception refuses a call (a verifiers ``@stop``, a turn limit), or after
:data:`MAX_TURNS` model calls.
"""

from __future__ import annotations

import json
from typing import Any

from openai import APIStatusError, AsyncOpenAI
from verifiers.v1.clients import ModelContext
from verifiers.v1.configs.harness import HarnessConfig
from verifiers.v1.dialects.chat import message_to_wire
from verifiers.v1.harness import Harness
from verifiers.v1.runtimes import ProgramResult, Runtime
from verifiers.v1.task import TaskData
from verifiers.v1.trace import Trace

__all__ = ["PlasmidChatHarness"]

#: The most model calls one segment makes (a model that calls tools forever stops here).
MAX_TURNS = 64


class PlasmidChatHarnessConfig(HarnessConfig):
    pass


class PlasmidChatHarness(Harness[PlasmidChatHarnessConfig]):
    """A chat loop in the rollout's process through the interception endpoint (see the module)."""

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_MCP = True
    SUPPORTS_RESUME = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx: ModelContext, trace: Trace, runtime: Runtime, endpoint: str, secret: str,
                     mcp_urls: dict[str, str], data: TaskData) -> ProgramResult:
        system, prompt = self.resolve_prompt(data)
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        elif prompt is not None:
            messages.extend(message_to_wire(message) for message in prompt)
        client = AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0)
        try:
            tools = await Tools.connect(mcp_urls)
            for _ in range(MAX_TURNS):
                try:
                    completion = await client.chat.completions.create(model=ctx.model, messages=messages,
                                                                      tools=tools.schemas or None)
                except APIStatusError as exc:
                    if trace.stop_condition is not None:   # the interception refused the turn (a @stop)
                        break
                    raise RuntimeError(f"model call failed ({exc.status_code}): {exc.message}") from None
                reply = completion.choices[0].message
                messages.append(reply.model_dump(exclude_none=True))
                if not reply.tool_calls:
                    break
                for call in reply.tool_calls:
                    content = await tools.call(call.function.name, call.function.arguments)
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
        finally:
            await client.close()
        return ProgramResult(exit_code=0, stdout="", stderr="")


class Tools:
    """The tools of a rollout's MCP servers: their OpenAI function specs and how to call them."""

    def __init__(self, urls: dict[str, str]) -> None:
        self.urls = urls
        self.schemas: list[dict[str, Any]] = []
        self.dispatch: dict[str, tuple[str, str]] = {}

    @classmethod
    async def connect(cls, urls: dict[str, str]) -> Tools:
        """List each server's tools (advertised as ``<server>_<tool>``; a duplicate name is a ValueError)."""
        tools = cls(urls)
        for server in urls:
            listed = await tools._session(server, lambda session: session.list_tools())
            for tool in listed.tools:
                name = f"{server}_{tool.name}" if server else tool.name
                if name in tools.dispatch:
                    raise ValueError(f"two MCP tools are advertised as {name!r}")
                tools.dispatch[name] = (server, tool.name)
                tools.schemas.append({"type": "function", "function": {
                    "name": name, "description": tool.description or "", "parameters": tool.inputSchema}})
        return tools

    async def call(self, name: str, arguments: str | None) -> str:
        """The text of tool ``name``'s result for ``arguments`` (JSON), or an error message for the model."""
        if name not in self.dispatch:
            return f"error: unknown tool {name!r}"
        try:
            args = json.loads(arguments or "{}")
        except json.JSONDecodeError as exc:
            return f"error: the arguments are not JSON ({exc.msg}); send a JSON object"
        if not isinstance(args, dict):
            return "error: the arguments must be a JSON object"
        server, tool = self.dispatch[name]
        result = await self._session(server, lambda session: session.call_tool(tool, args))
        texts = [block.text if block.type == "text" else str(block) for block in result.content]
        return "\n".join(texts)

    async def _session(self, server: str, use: Any) -> Any:
        """``await use(session)`` on a fresh MCP session with ``server`` (verifiers' servers are stateless HTTP)."""
        from mcp import ClientSession
        from mcp.client.streamable_http import streamable_http_client

        async with streamable_http_client(self.urls[server]) as (read, write, *_), \
                ClientSession(read, write) as session:
            await session.initialize()
            return await use(session)
