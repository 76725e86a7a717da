"""Test support (not a real engine): a fake inference server, the launched-process stand-in that
the serving library drives in its place, and ``FakeEngine``, a small
:class:`plasmid_serving.engine.HttpEngine` over them.

The fake server is an ``aiohttp.web`` application on its own event loop in a daemon thread of the
test process: it starts in milliseconds, and a test sets its behaviour through attributes
(``silent``: hang on every request; ``deaf_to_abort``; ``flush_refusals``) and reads what it was
sent (``loads``, ``answered``). Its wire format is made up for these tests; it serves nothing.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from aiohttp import web

from plasmid.options import Options
from plasmid.types import GenerationOutput, SamplingParams, Status
from plasmid_serving.engine import BlockingCall, Bucket, HttpEngine, NamedTensor, Ticket
from plasmid_serving.health import HealthPolicy
from plasmid_serving.http import request, request_blocking
from plasmid_serving.names import EngineNames
from plasmid_serving.options import ServingOptions
from plasmid_serving.pool import Server
from plasmid_serving.server_process import ManagedServer

NAMES = EngineNames("Fake", "fake", "plasmid-fake")
#: the fake model's tensors; its vocabulary is 16 tokens
TENSORS = ("embed", "head")
VOCAB = 16
#: pids of the process stand-ins: above Linux's pid_max, so never a real process
_PIDS = itertools.count(5_000_000)


class FakeServer:
    """Test support: one fake inference server on 127.0.0.1 (see the module docstring)."""

    def __init__(self) -> None:
        self.silent = False
        self.deaf_to_abort = False
        self.flush_refusals = 0
        #: what was loaded, in order: ``(kind, value)`` with kind load_disk, load (a payload) or adapter
        self.loads: list[tuple[str, Any]] = []
        self.version = 0
        self.answered = 0
        self.running = 0
        self.calls: list[str] = []
        self.port = 0
        self._held: set[asyncio.Event] = set()
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="fake-server", daemon=True)

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(timeout=30)

    def stop(self) -> None:
        """Stop at once, like a crash: requests being answered get no answer."""
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()

    async def _shutdown(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        pending = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in pending:   # handlers of a silent server
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def _listen(self) -> None:
        app = web.Application()
        app.router.add_get("/health", self._health)
        for path, handler in (("/generate", self._generate), ("/score", self._score), ("/abort", self._abort),
                              ("/flush", self._flush)):
            app.router.add_post(path, handler)
        for path in ("/load", "/load_disk", "/adapter", "/version", "/release", "/resume"):
            app.router.add_post(path, self._record)
        self._runner = web.AppRunner(app, shutdown_timeout=0.2, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def _hang_if_silent(self) -> None:
        while self.silent:
            await asyncio.sleep(0.05)

    async def _health(self, _: web.Request) -> web.Response:
        await self._hang_if_silent()
        return web.json_response({"ok": True})

    async def _generate(self, call: web.Request) -> web.Response:
        await self._hang_if_silent()
        body = await call.json()
        tokens = [(token + 1) % VOCAB for token in body["prompt"]][:body["max_new_tokens"]]
        status = "truncated"
        self.running += 1
        try:
            if body.get("hold"):
                held = asyncio.Event()
                self._held.add(held)
                await held.wait()
                self._held.discard(held)
                tokens, status = tokens[:1], "aborted"
        finally:
            self.running -= 1
        self.answered += 1
        return web.json_response({"tokens": tokens, "status": status, "version": self.version})

    async def _score(self, call: web.Request) -> web.Response:
        await self._hang_if_silent()
        body = await call.json()
        count = len(body["tokens"]) - body["prompt_length"]
        return web.json_response({"logprobs": [-0.5 * (i + 1) / body["temperature"] for i in range(count)]})

    async def _abort(self, _: web.Request) -> web.Response:
        self.calls.append("/abort")
        if not self.deaf_to_abort:
            for held in list(self._held):
                held.set()
        return web.json_response({"success": True})

    async def _flush(self, _: web.Request) -> web.Response:
        self.calls.append("/flush")
        if self.flush_refusals > 0:
            self.flush_refusals -= 1
            return web.json_response({"success": False, "message": "requests are running"}, status=400)
        return web.json_response({"success": True})

    async def _record(self, call: web.Request) -> web.Response:
        await self._hang_if_silent()
        body = await call.json()
        self.calls.append(call.path)
        kind = call.path.strip("/")
        if kind == "version":
            self.version = body["version"]
        elif kind in ("load", "load_disk", "adapter"):
            self.loads.append((kind, body["value"]))
            self.version = body.get("version", self.version)
        return web.json_response({"success": True})


class FakeHandle:
    """Test support: stands in for the ``subprocess.Popen`` of a launched server (no process)."""

    def __init__(self) -> None:
        self.pid = next(_PIDS)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        return self.returncode


@dataclass
class FakeProcess(ManagedServer):
    """Test support: a "launched server" whose start runs a new :class:`FakeServer` (on a new
    port, as a restarted server gets); ``kill`` is a crash (the stand-in process then reports exit
    code -9). Every server it ran is kept in ``history``, the running one is ``server``."""

    log_path: Path
    port: int = 0
    process: Any = None
    server: FakeServer | None = None
    history: list[FakeServer] = field(default_factory=list)
    #: ``start`` raises this many times more (a restart that fails)
    fail_starts: int = 0

    label = "Fake"
    provider = "fake"
    plugin = "plasmid-fake"
    timeout_option = "--fake-startup-timeout"
    health_path = "/health"
    health_timeout = 5.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a") as log:
            log.write("fake server: start\n")
        if self.fail_starts > 0:
            self.fail_starts -= 1
            raise RuntimeError("the fake server would not start")
        server = FakeServer()
        server.start()
        self.server, self.port, self.process = server, server.port, FakeHandle()
        self.history.append(server)

    def terminate(self) -> None:
        """Nothing to signal: there is no process."""

    def stop(self, grace: float = 15.0) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
        self.process = None

    def kill(self) -> None:
        """A crash: the server stops answering and the stand-in process has exited."""
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self.process is not None:
            self.process.returncode = -9


class FakeOptions(ServingOptions, Options, group="fake", description="test support: the fake engine"):
    """Test support: the fake engine's options (every one declared by ``ServingOptions``)."""

    prefix = "fake"
    serving_help = {"external_addrs": "attach to these fake servers"}


def fake_options(**settings: Any) -> FakeOptions:
    """Test support: ``FakeOptions`` with ``fake_<name>`` set from ``settings``."""
    return FakeOptions.from_values({f"fake_{name}": value for name, value in settings.items()})


class FakeEngine(HttpEngine):
    """Test support: an engine over fake servers, written as a plugin writes one (the hooks only).

    ``hold``: requests wait on the server until it is told to abort; ``ipc``: buckets are packed
    as if they were CUDA IPC handles (the journal cannot replay them).
    """

    names = NAMES
    health = HealthPolicy("/health", failures_before_restart=2, watch_attached=True, stop_grace=1.0)
    abort_call = ("/abort", {})
    flush_path = "/flush"
    release_calls = (("/release", {}),)
    resume_calls = (("/resume", {"tags": ["weights"]}), ("/resume", {"tags": ["kv_cache"]}))

    def __init__(self, run_dir: Path, *, servers: int = 1, abort_grace: float | None = None,
                 **settings: Any) -> None:
        settings.setdefault("health_interval", 0)
        super().__init__(fake_options(**settings), "/models/fake", VOCAB, TENSORS)
        self.count = servers
        self.abort_grace = abort_grace
        self.flush_timeout = 5.0
        self.hold = False
        self.ipc = False
        self.served: tuple[str, str] | None = None
        self._serve(SimpleNamespace(run_dir=run_dir))  # type: ignore[arg-type]  # all _launch reads

    def fake(self, index: int) -> FakeServer:
        """The fake server that server ``index`` runs now."""
        process = self.servers[index].process
        assert isinstance(process, FakeProcess) and process.server is not None
        return process.server

    def _launch(self, config: Any) -> list[Server]:
        log_dir = self.serving.log_dir(config.run_dir)
        return self._start_launched([Server(index, self.names, process=FakeProcess(log_dir / f"server-{index}.log"),
                                            device="cuda", can_release=True) for index in range(self.count)])

    def _probe(self, index: int, url: str) -> Server:
        self.expect(url, "/health", *request_blocking(url, "/health", method="GET", timeout=1))
        return Server(index, self.names, address=url)

    async def _generate_on(self, server: Server, ticket: Ticket, prompt_ids: list[int],
                           params: SamplingParams) -> GenerationOutput:
        body = {"prompt": prompt_ids, "max_new_tokens": params.max_new_tokens, "hold": self.hold}
        answer = asyncio.ensure_future(request(server.url, "/generate", body, timeout=self.request_timeout))
        cancelled = asyncio.ensure_future(ticket.cancel.wait())
        await asyncio.wait({answer, cancelled}, return_when=asyncio.FIRST_COMPLETED)
        cancelled.cancel()
        if not answer.done():   # abort_all's grace is over: close the request
            answer.cancel()
            return GenerationOutput([], [], Status.ABORTED, self.weight_version)
        decoded = self.expect(server.url, "/generate", *answer.result())
        tokens = decoded["tokens"]
        return GenerationOutput(tokens, [-1.0] * len(tokens), Status(decoded["status"]), self.weight_version)

    async def _score_on(self, server: Server, token_ids: list[int], prompt_length: int,
                        temperature: float) -> list[float]:
        body = {"tokens": token_ids, "prompt_length": prompt_length, "temperature": temperature or 1.0}
        answer = self.expect(server.url, "/score", *await request(server.url, "/score", body))
        logprobs: list[float] = answer["logprobs"]
        return logprobs

    async def _pack(self, named: list[NamedTensor]) -> Bucket:
        for name, _ in named:
            if name not in TENSORS:
                raise ValueError(f"fake: the model has no tensor {name!r}")
        names = [name for name, _ in named]
        payload = json.dumps({name: value for name, value in named})
        return Bucket(names, payload, lost="CUDA IPC handles" if self.ipc else None)

    async def _load_payload_on(self, server: Server, payload: str, weight_version: int) -> None:
        body = {"value": payload, "version": weight_version}
        self.expect(server.url, "/load", *await request(server.url, "/load", body))

    async def _load_disk_on(self, server: Server, directory: str, weight_version: int) -> None:
        body = {"value": directory, "version": weight_version}
        self.expect(server.url, "/load_disk", *await request(server.url, "/load_disk", body))

    async def load_adapter(self, path: str, weight_version: int) -> None:
        """Serve the adapter at ``path`` on top (as plasmid-vllm's ``load_adapter``)."""
        adapter = (f"fake-v{weight_version}", path)
        await asyncio.gather(*(self._control(server, "/adapter", {"value": list(adapter)})
                               for server in self.usable_servers()))
        self.journal.served_adapter(adapter)
        await self._received(weight_version, lambda journal: None)

    async def _commit_version(self, weight_version: int) -> None:
        await asyncio.gather(*(self._control(server, "/version", {"version": weight_version})
                               for server in self.usable_servers()))

    def _replay(self, server: Server, call: BlockingCall, version: int) -> None:
        journal = self.journal.snapshot()
        if journal.disk is not None:
            call("/load_disk", {"value": journal.disk})
        for _, payload in journal.payloads:
            call("/load", {"value": payload})
        if journal.adapter is not None:
            call("/adapter", {"value": list(journal.adapter)})
        call("/version", {"version": version})
