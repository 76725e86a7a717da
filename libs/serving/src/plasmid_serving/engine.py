"""``HttpEngine``: the :class:`plasmid.protocols.RolloutEngine` protocol, implemented once for
engines that drive inference servers over HTTP (plasmid-sglang, plasmid-vllm).

What the base does, for every such engine:

- servers: launches them (the subclass builds the processes, :meth:`HttpEngine._launch`) or
  attaches to ``--<prefix>-external-addrs`` (the subclass probes one, :meth:`HttpEngine._probe`),
  keeps them in a :class:`plasmid_serving.pool.ServerPool`, and watches them with a
  :class:`plasmid_serving.health.HealthMonitor` that restarts a dead one and replays the
  :class:`plasmid_serving.journal.WeightJournal` into it (:meth:`HttpEngine._restore`);
- ``generate``: bookkeeping (tickets, statistics), the choice of a server, admission, and
  retries from the prompt (same seed) when a server went silent, to another healthy server or to
  that one once restarted; the request itself is the subclass's (:meth:`HttpEngine._generate_on`);
- ``generate_with_images``: the same for a prompt with images (``images``, a
  :class:`plasmid_serving.images.ServedImages`, turns a sample into data URLs, or refuses a sample
  with images when the model is text-only); the subclass's request finds them on the ticket;
- ``response_logprobs`` (deprecated name ``score``): the arguments checked, the call retried
  across a restart (:meth:`HttpEngine._score_on`);
- ``abort_all``: the abort call on every server, repeated until every request in flight has
  returned; after ``abort_grace`` seconds the requests' ``cancel`` events are set (an engine that
  streams closes its streams then);
- ``flush_cache``, ``release_memory``, ``resume_memory``: the endpoints the class names, on every
  server in service (memory only where ``Server.can_release``);
- the weight-receiver API: :meth:`HttpEngine.update_weights`, :meth:`HttpEngine.load_payload`,
  :meth:`HttpEngine.load_weights_from_disk` and :meth:`HttpEngine.receive_weights` load on every
  server in service, journal what was loaded and commit the version;
  :meth:`HttpEngine.note_external_update` records weights that came another way;
- ``shutdown`` / ``close``, ``stats``, ``restarts``, ``weight_version``.

A subclass sets the class attributes (names, health policy, endpoints) and writes the hooks
marked "subclass" below: the launch command, the request and answer shapes, the update paths.
It calls :meth:`HttpEngine._serve` at the end of its ``__init__`` (and :func:`require_model` for
``--model`` at its start).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ClassVar

from plasmid.config import Config
from plasmid.errors import UsageError
from plasmid.kernel_options import GeneralOptions
from plasmid.types import GenerationOutput, SamplingParams, Status
from plasmid_serving.health import HealthMonitor, HealthPolicy
from plasmid_serving.http import (
    CONTROL_TIMEOUT,
    ServerCallFailed,
    ServerUnreachable,
    control_answer,
    request,
    request_blocking,
)
from plasmid_serving.images import ServedImages
from plasmid_serving.journal import WeightJournal
from plasmid_serving.names import EngineNames
from plasmid_serving.options import ServingOptions
from plasmid_serving.pool import Server, ServerPool
from plasmid_serving.server_process import stop_servers_at_exit

NamedTensor = tuple[str, Any]
#: A blocking control call on one server: ``call(path, body)`` answers the decoded JSON (restores).
BlockingCall = Callable[[str, dict[str, Any]], Any]


@dataclass(eq=False)
class Ticket:
    """One ``generate`` call in flight (``abort_all`` flags it, counts the aborted, and may set
    ``cancel`` to end a stream that does not end by itself)."""

    aborted: bool = False
    done: bool = False
    status: Status = Status.PENDING
    cancel: asyncio.Event = field(default_factory=asyncio.Event)
    #: the prompt's images as data URLs (:meth:`HttpEngine.generate_with_images`); ``None`` without images
    images: list[str] | None = None


@dataclass(frozen=True)
class Bucket:
    """Tensors packed for the servers (:meth:`HttpEngine._pack`): their checked ``names``, the
    ``payload`` as the load endpoint takes it, and ``lost``: ``None`` when the payload carries the
    bytes (the journal can replay it), else why it cannot be replayed (CUDA IPC handles)."""

    names: list[str]
    payload: str
    lost: str | None = None


def require_model(config: Config, names: EngineNames) -> str:
    """``--model``, which an engine serves.

    :raises UsageError: it was not given (the message names the engine, its plugin and framework).
    """
    model = GeneralOptions.of(config).model
    if not model:
        raise UsageError(f"engine '{names.provider}' (plugin {names.plugin}) needs --model DIR: a local Hugging Face "
                         f"model directory that {names.label} can serve")
    return str(model)


def backoff(attempt: int) -> float:
    """Seconds to wait before retry ``attempt`` (1, 2, ...) of a call that found its server silent:
    0.25, 0.5, 1, ... up to 8 (a restart is awaited separately, through the health monitor)."""
    return min(0.25 * 2.0 ** (attempt - 1), 8.0)


class HttpEngine:
    """The base of an engine over HTTP inference servers (see the module docstring)."""

    #: how the engine names itself (its provider name is also its option prefix)
    names: ClassVar[EngineNames]
    #: how its servers are watched and restarted
    health: ClassVar[HealthPolicy]
    #: ``(path, body)`` that aborts every request a server runs
    abort_call: ClassVar[tuple[str, dict[str, Any]]]
    #: seconds after which requests still running after aborts are cancelled here; ``None``: never
    abort_grace: ClassVar[float | None] = None
    #: the endpoint that flushes a server's prefix cache (refused while requests hold it: retried)
    flush_path: ClassVar[str]
    #: calls that release a server's memory, and that take it back, stage after stage
    release_calls: ClassVar[tuple[tuple[str, dict[str, Any]], ...]]
    resume_calls: ClassVar[tuple[tuple[str, dict[str, Any]], ...]]
    #: keys of a failed control answer that hold the server's message; how much of a body to quote
    answer_keys: ClassVar[tuple[str, ...]] = ("message", "error")
    answer_limit: ClassVar[int | None] = None
    #: seconds ``flush_cache`` retries a server that refuses (a subclass may set it per instance)
    flush_timeout: float = 60.0

    def __init__(self, options: ServingOptions, model_path: str, vocab_size: int, all_names: Iterable[str]) -> None:
        """Settings and state; no server yet (the subclass ends its ``__init__`` with :meth:`_serve`)."""
        self.serving = options
        self.model_path = model_path
        self.vocab_size = vocab_size
        self.request_timeout = float(options.setting("request_timeout"))
        self.retries = int(options.setting("request_retries"))
        self.startup_timeout = float(options.setting("startup_timeout"))
        self.journal = WeightJournal(enabled=options.setting("max_restarts") > 0, all_names=frozenset(all_names))
        self._weight_version = 0
        self._tickets: set[Ticket] = set()
        self._stats: dict[str, float] = {"requests": 0, "aborted": 0, "prompt_tokens": 0, "generated_tokens": 0,
                                         "retries": 0, "busy_seconds": 0.0}
        self._busy_since: float | None = None
        self._closed = False
        self._blocking = ThreadPoolExecutor(max_workers=4, thread_name_prefix=self.names.plugin)
        self.pool = ServerPool([], int(options.setting("max_concurrency")))
        self.monitor: HealthMonitor | None = None
        #: a sample's images as the servers take them (``images(sample)``: data URLs, or one error
        #: naming the engine when the model is text-only); what :meth:`generate_with_images` is given
        self.images = ServedImages(model_path, self.names)

    # ----------------------------------------------------------------------------------------
    # Building
    # ----------------------------------------------------------------------------------------

    def _serve(self, config: Config) -> None:
        """Launch or attach the servers, let the subclass front them (:meth:`_front`), then start
        the health monitor (``--<prefix>-health-interval`` 0: none). Stops what started on failure."""
        addresses = self.serving.external_addresses
        self.pool.servers = self._attach(addresses) if addresses else self._launch(config)
        try:
            self._front(config)
        except BaseException:
            self.close()
            raise
        interval = float(self.serving.setting("health_interval"))
        if interval > 0:
            self.monitor = HealthMonitor(self.servers, self.health, interval=interval,
                                         max_restarts=int(self.serving.setting("max_restarts")),
                                         startup_timeout=self.startup_timeout, restore=self._restore)
            self.monitor.start()

    def _launch(self, config: Config) -> list[Server]:
        """Subclass: build the servers of launched processes and return :meth:`_start_launched` of them."""
        raise NotImplementedError

    def _probe(self, index: int, url: str) -> Server:
        """Subclass: the attached server at ``url`` (``http://host:port``), its settings read from it.

        :raises ServerUnreachable: nothing answers there.
        """
        raise NotImplementedError

    def _front(self, config: Config) -> None:
        """Subclass, optional: what stands before the servers once they run (a router)."""

    def _start_launched(self, servers: list[Server]) -> list[Server]:
        """Start every launched server's process and wait until all are healthy; every one is
        stopped when one fails (and at exit, should this engine never be shut down)."""
        stop_servers_at_exit(self, servers, lambda engine: engine._closed)
        try:
            for server in servers:
                assert server.process is not None
                server.process.start()
            for server in servers:
                assert server.process is not None
                server.process.wait_healthy(self.startup_timeout)
                server.healthy.set()
        except BaseException:
            for server in servers:
                if server.process is not None:
                    server.process.stop()
            raise
        return servers

    def _attach(self, addresses: list[str]) -> list[Server]:
        servers = []
        for index, address in enumerate(addresses):
            url = (address if address.startswith("http") else f"http://{address}").rstrip("/")
            try:
                server = self._probe(index, url)
            except ServerUnreachable as exc:
                raise self.names.error(f"{self.serving.flag('external_addrs')} {address}: no {self.names.label} "
                                       f"server answers there ({exc})") from exc
            server.healthy.set()
            servers.append(server)
        return servers

    # ----------------------------------------------------------------------------------------
    # RolloutEngine
    # ----------------------------------------------------------------------------------------

    @property
    def weight_version(self) -> int:
        return self._weight_version

    @property
    def servers(self) -> list[Server]:
        return self.pool.servers

    @property
    def restarts(self) -> int:
        """Restarts of this engine's servers so far (``SupportsRestarts``)."""
        return sum(server.restarts for server in self.servers)

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerationOutput:
        """Sample one response (see the module docstring).

        :raises ValueError: an empty prompt or a token id outside the vocabulary.
        :raises ContextLengthError: the server refused the prompt and ``max_new_tokens`` as longer
            than the model's context; not retried.
        :raises ProviderError: the server failed the request, or stayed out of reach.
        """
        return await self._run(Ticket(), prompt_ids, params)

    async def generate_with_images(self, prompt_ids: list[int], images: list[str],
                                   params: SamplingParams) -> GenerationOutput:
        """Sample one response to ``prompt_ids`` (each image's tokens expanded, as plasmid's trainer has
        them) with ``images`` (what ``self.images(sample)`` answered), as :meth:`generate` does.

        :raises UsageError: the model takes no images, or the prompt's image tokens do not match the images.
        :raises ProviderError: as :meth:`generate`, and when a server expands the images into another prompt.
        """
        if not self.images.vision:
            raise self.images.refusal("a prompt with images, but the model is text-only (its config.json has no "
                                       "vision_config)")
        if not images:
            raise ValueError(f"{self.names.provider} generate_with_images: no images; use generate")
        self.images.server_prompt(list(prompt_ids), list(images))     # checked before anything is sent
        return await self._run(Ticket(images=list(images)), prompt_ids, params)

    async def _run(self, ticket: Ticket, prompt_ids: list[int], params: SamplingParams) -> GenerationOutput:
        self._check_open("generate")
        self._check_tokens(prompt_ids, "prompt_ids")
        if not prompt_ids:
            raise ValueError(f"{self.names.provider} generate: prompt_ids is empty; a response needs at least one "
                             f"prompt token")
        self._tickets.add(ticket)
        if self._busy_since is None:
            self._busy_since = time.perf_counter()
        try:
            output = await self._generate(ticket, list(prompt_ids), params)
        finally:
            ticket.done = True
            self._tickets.discard(ticket)
            if not self._tickets and self._busy_since is not None:
                self._stats["busy_seconds"] += time.perf_counter() - self._busy_since
                self._busy_since = None
        ticket.status = output.status
        self._stats["requests"] += 1
        self._stats["aborted"] += output.status is Status.ABORTED
        self._stats["prompt_tokens"] += len(prompt_ids)
        self._stats["generated_tokens"] += len(output.token_ids)
        return output

    async def response_logprobs(self, token_ids: list[int], prompt_length: int,
                                temperature: float) -> list[float]:
        """Log-probs of ``token_ids[prompt_length:]`` at ``temperature`` (0 counts as 1), as
        :func:`plasmid_torch.ops.logprobs_from_logits` defines them."""
        self._check_open("score")
        self._check_tokens(token_ids, "token_ids")
        if not 1 <= prompt_length <= len(token_ids):
            raise ValueError(f"{self.names.provider} score: prompt_length must be in [1, {len(token_ids)}] (the "
                             f"number of tokens), got {prompt_length}")
        if prompt_length == len(token_ids):
            return []
        tokens = list(token_ids)

        async def call(server: Server) -> list[float]:
            return await self._score_on(server, tokens, prompt_length, temperature)

        result: list[float] = await self._with_recovery(self.pool.choose(), call)
        return result

    #: the deprecated name of :meth:`response_logprobs` (see :class:`plasmid.protocols.RolloutEngine`)
    score = response_logprobs

    async def abort_all(self) -> int:
        """Abort every request in flight (see the module docstring); returns how many ended ABORTED.

        :raises ProviderError: requests had not returned 30 s after the first abort.
        """
        self._check_open("abort_all")
        targets = [t for t in self._tickets if not t.done]
        for ticket in targets:
            ticket.aborted = True
        start = time.monotonic()
        while True:
            await asyncio.gather(*(self._abort_on(server) for server in self._reachable()))
            waited = time.monotonic()
            while any(not t.done for t in targets) and time.monotonic() - waited < 0.5:
                await asyncio.sleep(0.01)
            if all(t.done for t in targets):
                break
            if self.abort_grace is not None and time.monotonic() - start >= self.abort_grace:
                for ticket in targets:
                    ticket.cancel.set()
            if time.monotonic() - start > 30.0:
                raise self.names.error(f"{self.names.provider} abort_all: {sum(not t.done for t in targets)} "
                                       f"requests had not returned 30 s after the abort")
        return sum(t.status is Status.ABORTED for t in targets)

    async def update_weights(self, named_tensors: Iterable[NamedTensor], weight_version: int) -> None:
        """Load ``(Hugging Face name, torch tensor or numpy array)`` pairs (a subset is fine: one
        bucket) into every server and set ``weight_version``.

        :raises ValueError: a name the model does not have (the message names it) or a shape
            that differs from the served tensor's; checked before anything is sent.
        """
        self._check_open("update_weights")
        named = list(named_tensors)
        if not named:
            return
        bucket = await self._pack(named)
        await self.load_payload(bucket.names, bucket.payload, weight_version, lost=bucket.lost)

    async def load_payload(self, names: list[str], payload: str, weight_version: int, *,
                           lost: str | None = None) -> None:
        """Load one packed bucket (:meth:`_pack`) holding ``names`` (already checked) into every
        server and set the version; ``lost``: why the journal cannot replay it (``None``: it can)."""

        async def load(server: Server) -> None:
            await self._load_payload_on(server, payload, weight_version)

        def record(journal: WeightJournal) -> None:
            if lost is None:
                journal.loaded_payload(names, payload)
            else:
                journal.lost_track(lost)

        await self.receive_weights(load, weight_version, record)

    async def load_weights_from_disk(self, directory: str, weight_version: int) -> None:
        """Load the Hugging Face checkpoint in ``directory`` (every tensor) into every server and
        set the version."""
        path = str(directory)

        async def load(server: Server) -> None:
            await self._load_disk_on(server, path, weight_version)

        await self.receive_weights(load, weight_version, lambda journal: journal.loaded_directory(path))

    async def receive_weights(self, load: Callable[[Server], Awaitable[None]], weight_version: int,
                              record: Callable[[WeightJournal], None]) -> None:
        """The weight-receiver API: ``await load(server)`` on every server in service (waiting
        for a restarted one and loading again), then ``record(journal)`` (what a restarted server
        must replay) and :meth:`_received`."""
        self._check_open("update_weights")
        await self._before_load()
        await asyncio.gather(*(self._with_recovery(server, load) for server in self.usable_servers()))
        await self._received(weight_version, record)

    async def note_external_update(self, weight_version: int, how: str) -> None:
        """Weights reached the servers without this engine (``how``: a distributed group): record
        that they cannot be replayed, flush the prefix caches and set ``weight_version``."""
        await self._received(weight_version, lambda journal: journal.lost_track(how), flush=True)

    async def _received(self, weight_version: int, record: Callable[[WeightJournal], None], *,
                        flush: bool = False) -> None:
        record(self.journal)
        if flush:
            await self.flush_cache()
        await self._commit_version(weight_version)
        self._weight_version = weight_version

    async def get_weights(self, names: Sequence[str]) -> dict[str, Any]:
        """Subclass: the served values of the named tensors as numpy arrays."""
        raise NotImplementedError

    async def flush_cache(self) -> None:
        """Flush every server's prefix cache, retrying while requests run (never silently skipped:
        stale prefix-cache entries would give wrong log-probs)."""
        self._check_open("flush_cache")
        await asyncio.gather(*(self._with_recovery(server, self._flush) for server in self.usable_servers()))

    async def release_memory(self) -> None:
        """Release weights and KV cache on the servers that can (``Server.can_release``); nothing on CPU."""
        self._check_open("release_memory")
        await self._on_releasable(self.release_calls)

    async def resume_memory(self) -> None:
        """Take back what ``release_memory`` released, stage after stage."""
        self._check_open("resume_memory")
        await self._on_releasable(self.resume_calls)

    async def shutdown(self) -> None:
        """Abort what runs, stop the monitor and every launched server; later calls raise."""
        if self._closed:
            return
        try:
            if self._tickets:
                await self.abort_all()
        finally:
            self.close()

    def close(self) -> None:
        """Stop the monitor, what fronts the servers and the launched servers now (blocking; also
        run at exit)."""
        self._closed = True
        if self.monitor is not None:
            self.monitor.stop()
        self._stop_front()
        launched = [server.process for server in self.servers if server.process is not None]
        for process in launched:
            process.terminate()
        for process in launched:
            process.stop()
        self._blocking.shutdown(wait=False, cancel_futures=True)

    def stats(self) -> dict[str, float]:
        """Cumulative counters: ``requests``, ``aborted``, ``prompt_tokens``, ``generated_tokens``,
        ``retries`` (requests sent again after a server failed), ``busy_seconds`` (time with at
        least one request in flight), ``restarts``, ``tokens_per_second`` (per busy second), and
        the subclass's own."""
        stats = dict(self._stats)
        if self._busy_since is not None:
            stats["busy_seconds"] += time.perf_counter() - self._busy_since
        stats["restarts"] = float(self.restarts)
        stats["tokens_per_second"] = stats["generated_tokens"] / stats["busy_seconds"] if stats["busy_seconds"] else 0.0
        return {key: float(value) for key, value in stats.items()}

    # ----------------------------------------------------------------------------------------
    # What a subclass writes: requests, answers, update paths
    # ----------------------------------------------------------------------------------------

    async def _generate_on(self, server: Server, ticket: Ticket, prompt_ids: list[int],
                           params: SamplingParams) -> GenerationOutput:
        """Subclass: one response from ``server`` (admitted, counted in flight).

        :raises ServerUnreachable: the server went silent (the base retries from the prompt).
        """
        raise NotImplementedError

    async def _score_on(self, server: Server, token_ids: list[int], prompt_length: int,
                        temperature: float) -> list[float]:
        """Subclass: the log-probs :meth:`score` answers, from ``server`` (arguments checked)."""
        raise NotImplementedError

    async def _pack(self, named: list[NamedTensor]) -> Bucket:
        """Subclass: the tensors checked against the served model and packed for
        :meth:`_load_payload_on` (off the event loop: ``self._blocking``).

        :raises ValueError: a name or shape the served model does not have.
        """
        raise NotImplementedError

    async def _load_payload_on(self, server: Server, payload: str, weight_version: int) -> None:
        """Subclass: load a packed bucket into ``server``."""
        raise NotImplementedError

    async def _load_disk_on(self, server: Server, directory: str, weight_version: int) -> None:
        """Subclass: load the checkpoint in ``directory`` into ``server``."""
        raise NotImplementedError

    async def _before_load(self) -> None:
        """Subclass, optional: what a weight load needs first (serve the plain weights again)."""

    async def _commit_version(self, weight_version: int) -> None:
        """Subclass, optional: make every server report ``weight_version`` once weights are loaded
        (an engine whose load calls carry the version has nothing to do)."""

    def _replay(self, server: Server, call: BlockingCall, version: int) -> None:
        """Subclass: put the journal's weights and ``version`` on a restarted ``server`` with
        blocking ``call`` (the monitor's thread); :meth:`_restore` checked it can."""
        raise NotImplementedError

    def _restored(self, server: Server, old_url: str) -> None:
        """Subclass, optional: ``server`` serves again at a new address (tell a router)."""

    def _stop_front(self) -> None:
        """Subclass, optional: stop what :meth:`_front` started."""

    # ----------------------------------------------------------------------------------------
    # Calls, recovery, checks
    # ----------------------------------------------------------------------------------------

    def expect(self, url: str, path: str, status: int, text: str) -> Any:
        """The decoded answer of a control call (query string left out of messages).

        :raises ServerCallFailed: the call failed (an HTTP error, or ``"success": false``).
        """
        plugin, provider = self.names.plugin, self.names.provider
        return control_answer(url, path.split("?")[0], status, text, server=self.names.label,
                              error=lambda message: ServerCallFailed(message, provider=provider, plugin=plugin),
                              keys=self.answer_keys, limit=self.answer_limit)

    async def _control(self, server: Server, path: str, body: dict[str, Any] | None = None) -> Any:
        """A control call that must succeed, waiting for the server when it is being restarted."""

        async def call(server: Server) -> Any:
            status, text = await request(server.url, path, body or {}, timeout=CONTROL_TIMEOUT)
            return self.expect(server.url, path, status, text)

        return await self._with_recovery(server, call)

    def _blocking_call(self, server: Server) -> BlockingCall:
        """A blocking control call on ``server`` (for the monitor's thread)."""

        def call(path: str, body: dict[str, Any]) -> Any:
            status, text = request_blocking(server.url, path, body)
            return self.expect(server.url, path, status, text)

        return call

    async def _generate(self, ticket: Ticket, prompt_ids: list[int], params: SamplingParams) -> GenerationOutput:
        attempt = 0
        while True:
            server = self.pool.choose()
            server.in_flight += 1
            try:
                async with self.pool.admission(server):
                    output = await self._generate_on(server, ticket, prompt_ids, params)
                server.requests += 1
                return output
            except ServerUnreachable as exc:
                attempt += 1
                if ticket.aborted:
                    return GenerationOutput([], [], Status.ABORTED, self._weight_version)
                if attempt > self.retries:
                    raise self.names.error(f"{self.names.provider} generate: {server.name} did not answer ({exc}), "
                                           f"{self.retries} retries used "
                                           f"({self.serving.flag('request_retries')})") from exc
                self._stats["retries"] += 1
                self._suspect(server)
                await asyncio.sleep(backoff(attempt))
                if not any(other.healthy.is_set() for other in self._reachable()):
                    await self.pool.wait_usable(server, self.startup_timeout + 60)
            finally:
                server.in_flight -= 1

    async def _with_recovery(self, server: Server, call: Callable[[Server], Awaitable[Any]]) -> Any:
        """``await call(server)``; when the server does not answer, wait for its restart and call again."""
        for attempt in itertools.count():
            await self.pool.wait_usable(server, self.startup_timeout + 60)
            try:
                return await call(server)
            except ServerUnreachable as exc:
                if attempt >= self.retries:
                    raise self.names.error(f"{self.names.provider}: {server.name} did not answer ({exc}), "
                                           f"{self.retries} retries used") from exc
                self._suspect(server)
                await asyncio.sleep(backoff(attempt + 1))
        raise AssertionError("unreachable")

    async def _flush(self, server: Server) -> None:
        deadline = time.monotonic() + self.flush_timeout
        delay = 0.02
        while True:
            status, text = await request(server.url, self.flush_path, {})
            if status == 200 and _succeeded(text):
                return
            if time.monotonic() > deadline:
                raise self.names.error(f"{self.names.provider} flush_cache: {server.name} refused to flush for "
                                       f"{self.flush_timeout:.0f} s (it flushes only when no request runs; last "
                                       f"answer HTTP {status}: {text.strip()[:200]}); stale prefix-cache entries "
                                       f"would give wrong log-probs")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    async def _abort_on(self, server: Server) -> None:
        path, body = self.abort_call
        try:
            await request(server.url, path, body, timeout=30)
        except ServerUnreachable:
            self._suspect(server)

    async def _on_releasable(self, calls: Sequence[tuple[str, dict[str, Any]]]) -> None:
        servers = [server for server in self.usable_servers() if server.can_release and server.device != "cpu"]
        for path, body in calls:
            await asyncio.gather(*(self._control(server, path, body) for server in servers))

    def _restore(self, server: Server, old_url: str) -> None:
        """Put the engine's current weights and version on a restarted ``server`` (monitor thread),
        then :meth:`_restored`.

        :raises ProviderError: the journal lost track of the weights (they cannot be restored).
        """
        journal = self.journal.snapshot()
        version = self._weight_version
        if journal.lost is not None and version > 0:
            raise self.names.error(f"its weights (version {version}) came through {journal.lost} and cannot be "
                                   f"restored by this engine")
        self._replay(server, self._blocking_call(server), version)
        self.names.report(f"{server.name}: restored weight version {version} ({len(journal.payloads)} buckets"
                          f"{', from ' + journal.disk if journal.disk else ''})")
        self._restored(server, old_url)

    def _suspect(self, server: Server) -> None:
        server.mark_suspect()
        if self.monitor is not None and self.monitor.watches(server):
            self.monitor.wake()
        else:
            server.healthy.set()  # nobody would look at it again: retry it directly

    def usable_servers(self) -> list[Server]:
        """The servers in service (a server out of service is left out of updates and flushes);
        raises when none is."""
        return self.pool.usable()

    def _reachable(self) -> list[Server]:
        return [server for server in self.servers if server.failure is None]

    def _check_open(self, method: str) -> None:
        if self._closed:
            raise RuntimeError(f"{self.names.provider} {method}: the engine was shut down; build a new one")

    def _check_tokens(self, token_ids: Sequence[int], argument: str) -> None:
        if token_ids and (min(token_ids) < 0 or max(token_ids) >= self.vocab_size):
            bad = next(t for t in token_ids if not 0 <= t < self.vocab_size)
            raise ValueError(f"{self.names.provider}: {argument} holds token id {bad}, outside the vocabulary of "
                             f"the model at {self.model_path} (ids 0..{self.vocab_size - 1}); was it tokenized for "
                             f"another model?")


def _succeeded(text: str) -> bool:
    """False only for a JSON answer ``{"success": false, ...}`` (a plain-text answer is a success)."""
    try:
        answer = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        return True
    return not (isinstance(answer, dict) and answer.get("success") is False)
