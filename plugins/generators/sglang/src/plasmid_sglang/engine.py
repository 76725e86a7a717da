"""``SGLangEngine``: a :class:`plasmid.protocols.RolloutEngine` over one or more SGLang servers.

Built by the kernel as ``SGLangEngine(config)``. It launches ``--sglang-servers`` servers on
``--model`` (see :mod:`plasmid_sglang.server`; every ``--sglang-*`` native option applies), or
attaches to ``--sglang-external-addrs``, and waits until they are healthy; with ``--sglang-router``
an SGLang router fronts them (:mod:`plasmid_sglang.router`).

- ``generate``: one ``/generate`` request with the prompt's token ids and log-probs (formats in
  :mod:`plasmid_sglang.requests`), on the least loaded healthy server (:mod:`plasmid_sglang.pool`),
  or through the router, which picks one.
  A request that finds its server silent is sent again from its prompt with the same seed (at
  most ``--sglang-request-retries`` times, with backoff), to another healthy server or, when
  there is none, to that one once the health monitor has restarted it (:mod:`plasmid_sglang.health`).
  A request whose prompt and ``max_new_tokens`` exceed the model's context is refused by SGLang
  (HTTP 400, "Requested token count exceeds the model's maximum context length of N tokens ...");
  it is raised as :class:`~plasmid.errors.ContextLengthError`, naming both lengths, not retried.
- ``score``: the log-probs of given tokens (``max_new_tokens`` 0), rescaled exactly to the
  temperature asked for.
- ``abort_all``: ``/abort_request`` with ``abort_all`` on every server, repeated until every
  request in flight has returned (``Status.ABORTED``, with the tokens generated so far).
- ``update_weights``: the tensors are checked against the checkpoint's names and shapes
  (:mod:`plasmid_sglang.weights`), packed into one flattened bucket and loaded through
  ``/update_weights_from_tensor`` inside ``/begin_weight_update`` ... ``/end_weight_update``, with
  the new version, then the prefix cache is flushed; when requests are in flight on a server,
  generation is paused around the update (SGLang's ``retract`` mode: they recompute their context
  with the new weights and go on). The server's version is read back and checked.
- ``flush_cache``: ``/flush_cache``, which SGLang refuses while requests run: retried until it
  succeeds (``--sglang-flush-timeout``), never silently skipped (stale prefix-cache entries would
  give wrong log-probs).
- ``release_memory`` / ``resume_memory``: ``/release_memory_occupation`` and a two-stage
  ``/resume_memory_occupation`` (weights, then KV cache) on GPU servers running with the memory
  saver (plasmid turns it on with ``--placement colocate``); on CPU servers nothing is called
  (releasing killed a CPU server in sglang 0.5.23).
- ``get_weights``: ``/get_weights_by_name`` (SGLang implements it for some model classes only,
  e.g. Llama; Qwen2 lacks it in 0.5.23).

The weight syncs of :mod:`plasmid_sglang.syncs` use :meth:`SGLangEngine.load_payload`,
:meth:`SGLangEngine.load_weights_from_disk` and the distributed-group methods.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar

from plasmid.config import Config
from plasmid.errors import ContextLengthError, ProviderError, UsageError
from plasmid.kernel_options import GeneralOptions, RolloutOptions, ScheduleOptions
from plasmid.options import Options
from plasmid.server_process import stop_servers_at_exit
from plasmid.types import GenerationOutput, SamplingParams, Status
from plasmid_sglang.client import ServerCallFailed, ServerUnreachable, expect_success, request, request_blocking
from plasmid_sglang.health import HealthMonitor, report
from plasmid_sglang.journal import WeightJournal
from plasmid_sglang.options import SGLangOptions
from plasmid_sglang.pool import Server, ServerPool
from plasmid_sglang.requests import (
    generate_request,
    needs_continuation,
    parse_generate,
    parse_score,
    parse_version,
    score_request,
)
from plasmid_sglang.router import Router
from plasmid_sglang.routing import RoutingLayout
from plasmid_sglang.server import ServerProcess, given_native, server_fields
from plasmid_sglang.weights import TensorTable, as_torch, choose_transport, flattened_bucket, serialize

NamedTensor = tuple[str, Any]

#: Servers launched by this process so far (each gets ``--seed`` plus its number as its seed).
_LAUNCHED = itertools.count()


@dataclass(eq=False)
class _Ticket:
    """One ``generate`` call in flight (``abort_all`` flags it and counts the aborted)."""

    aborted: bool = False
    done: bool = False
    status: Status = Status.PENDING


class SGLangEngine:
    """Rollouts from SGLang servers that it launches on ``--model`` or attaches to (see the module
    docstring). Options: ``--model``, ``--seed``, ``--placement`` and the ``--sglang-*`` options."""

    option_classes: ClassVar[tuple[type[Options], ...]] = (SGLangOptions, GeneralOptions, ScheduleOptions,
                                                           RolloutOptions)

    def __init__(self, config: Config) -> None:
        self.options = options = SGLangOptions.of(config)
        model = GeneralOptions.of(config).model
        if not model:
            raise UsageError("engine 'sglang' (plugin plasmid-sglang) needs --model DIR: a local Hugging Face "
                             "model directory that SGLang can serve")
        self.model_path = str(model)
        self.table = TensorTable(self.model_path)
        self.vocab_size = self.table.vocab_size
        #: ``--return-routed-experts``: the model's routing layout (plasmid_sglang.routing); ``None``: not asked
        self.routing = RoutingLayout.of_model(self.model_path) if RolloutOptions.of(config).return_routed_experts \
            else None
        self.request_timeout = options.sglang_request_timeout
        self.retries = options.sglang_request_retries
        self.flush_timeout = options.sglang_flush_timeout
        self.startup_timeout = options.sglang_startup_timeout
        self.transport = options.sglang_tensor_transport
        max_restarts = options.sglang_max_restarts
        self.journal = WeightJournal(enabled=max_restarts > 0, all_names=frozenset(self.table.tensors))
        self._weight_version = 0
        self._tickets: set[_Ticket] = set()
        self._stats = {"requests": 0, "aborted": 0, "prompt_tokens": 0, "generated_tokens": 0, "retries": 0,
                       "continuations": 0, "busy_seconds": 0.0}
        self._busy_since: float | None = None
        self._closed = False
        self._blocking = ThreadPoolExecutor(max_workers=4, thread_name_prefix="plasmid-sglang")
        addresses = options.external_addresses
        servers = self._attach(addresses) if addresses else self._launch(config)
        self.pool = ServerPool(servers, options.sglang_max_concurrency)
        self.monitor: HealthMonitor | None = None
        self.router: Router | None = None
        if options.sglang_router:
            self.router = Router(options.sglang_router_policy, list(options.sglang_router_arg),
                                 options.log_dir(config.run_dir) / "router.log", options.server_env)
            try:
                self.router.start([server.url for server in servers], self.startup_timeout)
            except BaseException:
                self.close()
                raise
        if options.sglang_health_interval > 0:
            self.monitor = HealthMonitor(servers, interval=options.sglang_health_interval,
                                         max_restarts=max_restarts, startup_timeout=self.startup_timeout,
                                         restore=self._restore)
            self.monitor.start()

    # ----------------------------------------------------------------------------------------
    # Building
    # ----------------------------------------------------------------------------------------

    def _launch(self, config: Config) -> list[Server]:
        log_dir = self.options.log_dir(config.run_dir)
        env = self.options.server_env
        port = given_native(config).get("port")
        servers = []
        for index in range(self.options.sglang_servers):
            ordinal = next(_LAUNCHED)
            values, texts = server_fields(config, self.model_path, ordinal)
            process = ServerProcess(values, texts, env, log_dir / f"server-{ordinal}.log",
                                    fixed_port=int(port) + ordinal if port else None)
            servers.append(Server(index, process=process, tp_size=int(values.get("tp_size") or 1),
                                  device=str(values["device"]), memory_saver=bool(values.get("enable_memory_saver"))))
        stop_servers_at_exit(self, servers, lambda engine: engine._closed)
        try:
            for server in servers:
                server.process.start()
            for server in servers:
                server.process.wait_healthy(self.startup_timeout)
                server.healthy.set()
        except BaseException:
            for server in servers:
                server.process.stop()
            raise
        return servers

    def _attach(self, addresses: list[str]) -> list[Server]:
        servers = []
        for index, address in enumerate(addresses):
            url = address if address.startswith("http") else f"http://{address}"
            try:
                status, text = request_blocking(url, "/server_info", method="GET", timeout=60)
            except ServerUnreachable as exc:
                raise ProviderError(f"--sglang-external-addrs {address}: no SGLang server answers there ({exc})",
                                    provider="sglang", plugin="plasmid-sglang") from exc
            info = expect_success(url, "/server_info", status, text)
            server = Server(index, address=url.rstrip("/"), tp_size=int(info.get("tp_size") or 1),
                            device=str(info.get("device") or "cuda"),
                            memory_saver=bool(info.get("enable_memory_saver")))
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

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerationOutput:
        """Sample one response (see the module docstring).

        :raises ValueError: an empty prompt or a token id outside the vocabulary.
        :raises ContextLengthError: the server refused the prompt and ``max_new_tokens`` as longer
            than the model's context (HTTP 400); not retried.
        :raises ProviderError: the server failed the request, or stayed out of reach.
        """
        self._check_open("generate")
        self._check_tokens(prompt_ids, "prompt_ids")
        if not prompt_ids:
            raise ValueError("sglang generate: prompt_ids is empty; a response needs at least one prompt token")
        ticket = _Ticket()
        self._tickets.add(ticket)
        self._started_work()
        try:
            output = await self._generate(ticket, list(prompt_ids), params)
        finally:
            ticket.done = True
            self._tickets.discard(ticket)
            self._finished_work()
        ticket.status = output.status
        self._stats["requests"] += 1
        self._stats["aborted"] += output.status is Status.ABORTED
        self._stats["prompt_tokens"] += len(prompt_ids)
        self._stats["generated_tokens"] += len(output.token_ids)
        return output

    async def score(self, token_ids: list[int], prompt_length: int, temperature: float) -> list[float]:
        """Log-probs of ``token_ids[prompt_length:]`` at ``temperature`` (0 counts as 1), as
        :func:`plasmid_torch.ops.logprobs_from_logits` defines them."""
        self._check_open("score")
        self._check_tokens(token_ids, "token_ids")
        if not 1 <= prompt_length <= len(token_ids):
            raise ValueError(f"sglang score: prompt_length must be in [1, {len(token_ids)}] (the number of tokens), "
                             f"got {prompt_length}")
        if prompt_length == len(token_ids):
            return []
        body = score_request(list(token_ids), prompt_length, temperature, self.vocab_size)

        async def call(server: Server) -> list[float]:
            status, text = await request(self._generate_url(server), "/generate", body, timeout=self.request_timeout)
            answer = self._generate_answer(server, status, text, len(token_ids), 0)
            return parse_score(answer, list(token_ids), prompt_length, temperature)

        return await self._with_recovery(self.pool.choose(), call)

    async def abort_all(self) -> int:
        """Abort every request in flight (see the module docstring); returns how many ended ABORTED."""
        self._check_open("abort_all")
        targets = [t for t in self._tickets if not t.done]
        for ticket in targets:
            ticket.aborted = True
        deadline = time.monotonic() + 30.0
        while True:
            await asyncio.gather(*(self._abort_on(server) for server in self._reachable()))
            waited = time.monotonic()
            while any(not t.done for t in targets) and time.monotonic() - waited < 0.5:
                await asyncio.sleep(0.01)
            if all(t.done for t in targets):
                break
            if time.monotonic() > deadline:
                raise ProviderError(f"sglang abort_all: {sum(not t.done for t in targets)} requests had not returned "
                                    f"30 s after /abort_request", provider="sglang", plugin="plasmid-sglang")
        return sum(t.status is Status.ABORTED for t in targets)

    async def update_weights(self, named_tensors: Iterable[NamedTensor], weight_version: int) -> None:
        """Load ``(Hugging Face name, torch tensor or numpy array)`` pairs (a subset is fine: one
        bucket) into every server and set ``weight_version``.

        :raises ValueError: a name the model does not have (the message names it) or a shape
            that differs from the served tensor's; checked before anything is sent.
        """
        self._check_open("update_weights")
        named = [(name, as_torch(value)) for name, value in named_tensors]
        if not named:
            return
        names = self.table.check((name, tuple(tensor.shape)) for name, tensor in named)
        transport = choose_transport(self.transport, [tensor for _, tensor in named])
        loop = asyncio.get_running_loop()
        payload = await loop.run_in_executor(
            self._blocking, lambda: serialize(flattened_bucket(list(zip(names, [t for _, t in named],
                                                                        strict=True))), transport))
        await self.load_payload(names, payload, weight_version, restorable=transport == "pickle")

    async def get_weights(self, names: Sequence[str]) -> dict[str, Any]:
        """The served values of the named tensors as float32 numpy arrays, read from one server
        (of a tensor-parallel server, SGLang answers its first rank's part)."""
        import numpy as np

        self._check_open("get_weights")
        server = self.pool.choose()
        result = {}
        for name in names:
            shape = self.table.shape_of(name)

            async def call(server: Server, name: str = name, rows: int = max(shape[:1] or (1,))) -> Any:
                status, text = await request(server.url, "/get_weights_by_name",
                                             {"name": name, "truncate_size": rows})
                if status != 200:
                    raise ServerCallFailed(f"{server.name}: /get_weights_by_name {name} failed (HTTP {status}): "
                                           f"{text.strip()}; SGLang implements it for some model classes only "
                                           f"(e.g. LlamaForCausalLM; not Qwen2ForCausalLM in 0.5.23), see its log")
                return json.loads(text)

            values = await self._with_recovery(server, call)
            result[name] = np.asarray(values, dtype=np.float32).reshape(shape)
        return result

    async def flush_cache(self) -> None:
        """Flush every server's prefix cache, retrying while requests run (see the module docstring)."""
        self._check_open("flush_cache")
        await asyncio.gather(*(self._with_recovery(server, self._flush) for server in self.usable_servers()))

    async def release_memory(self) -> None:
        """Release weights and KV cache on GPU servers with the memory saver; nothing on CPU."""
        self._check_open("release_memory")
        await asyncio.gather(*(self._control(server, "/release_memory_occupation", {})
                               for server in self.usable_servers() if self._can_release(server)))

    async def resume_memory(self) -> None:
        """Take the memory back: weights first, then the KV cache (what ``release_memory`` released)."""
        self._check_open("resume_memory")
        for tags in (["weights"], ["kv_cache"]):
            await asyncio.gather(*(self._control(server, "/resume_memory_occupation", {"tags": tags})
                                   for server in self.usable_servers() if self._can_release(server)))

    async def shutdown(self) -> None:
        """Abort what runs, stop the monitor and every launched server; later calls raise."""
        if self._closed:
            return
        try:
            if self._tickets:
                await self.abort_all()
        finally:
            self._closed = True
            self.close()

    def close(self) -> None:
        """Stop the monitor and the launched servers now (blocking; also run at exit)."""
        self._closed = True
        if self.monitor is not None:
            self.monitor.stop()
        if self.router is not None:
            self.router.stop()
        launched = [server.process for server in self.servers if server.process is not None]
        for process in launched:
            process.terminate()
        for process in launched:
            process.stop()
        self._blocking.shutdown(wait=False, cancel_futures=True)

    # ----------------------------------------------------------------------------------------
    # Used by the weight syncs and the runtime
    # ----------------------------------------------------------------------------------------

    async def pause_generation(self) -> None:
        """Pause every server: running requests go back to its queue (SGLang's ``retract`` mode)
        and recompute their context when generation continues; the cache can be flushed meanwhile."""
        await asyncio.gather(*(self._control(server, "/pause_generation", {"mode": "retract"})
                               for server in self.usable_servers()))

    async def continue_generation(self) -> None:
        await asyncio.gather(*(self._control(s, "/continue_generation", {}) for s in self.usable_servers()))

    async def load_payload(self, names: list[str], payload: str, weight_version: int, *, restorable: bool) -> None:
        """Load one serialized flattened bucket (:func:`plasmid_sglang.weights.serialize`) holding
        ``names`` (already checked) into every server and set the version. ``restorable``: the
        payload carries the bytes (not CUDA handles), so the journal can replay it."""
        self._check_open("update_weights")
        body = {"load_format": "flattened_bucket", "flush_cache": False, "weight_version": str(weight_version)}

        async def load(server: Server) -> None:
            await self._weight_update(server, "/update_weights_from_tensor",
                                      {**body, "serialized_named_tensors": [payload] * server.tp_size},
                                      weight_version)

        await asyncio.gather(*(self._with_recovery(server, load) for server in self.usable_servers()))
        if restorable:
            self.journal.loaded_payload(names, payload)
        else:
            self.journal.lost_track("CUDA IPC handles (--sglang-tensor-transport cuda-ipc)")
        self._weight_version = weight_version

    async def load_weights_from_disk(self, directory: str, weight_version: int) -> None:
        """Load the Hugging Face checkpoint in ``directory`` (every tensor) with
        ``/update_weights_from_disk`` into every server, and set the version."""
        self._check_open("load_weights_from_disk")
        body = {"model_path": str(directory), "flush_cache": False, "weight_version": str(weight_version)}

        async def load(server: Server) -> None:
            await self._weight_update(server, "/update_weights_from_disk", body, weight_version, session=False)

        await asyncio.gather(*(self._with_recovery(server, load) for server in self.usable_servers()))
        self.journal.loaded_directory(str(directory))
        self._weight_version = weight_version

    def rank_count(self) -> int:
        """Ranks this engine's servers in service bring to a distributed weight-update group."""
        return sum(server.tp_size for server in self.usable_servers())

    async def join_update_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                                group_name: str, backend: str) -> None:
        """Have every server join the weight-update group (blocks until every member joined):
        its ranks follow ``rank_offset``, server after server."""
        calls, offset = [], rank_offset
        for server in self.usable_servers():
            body = {"master_address": master_address, "master_port": master_port, "rank_offset": offset,
                    "world_size": world_size, "group_name": group_name, "backend": backend}
            calls.append(self._control(server, "/init_weights_update_group", body))
            offset += server.tp_size
        await asyncio.gather(*calls)

    async def receive_bucket(self, group_name: str, description: list[tuple[str, str, list[int]]], load_format: str,
                             weight_version: int) -> None:
        """Receive one bucket broadcast by rank 0 of ``group_name`` on every server and load it.
        ``description``: ``[(name, dtype, shape)]`` in broadcast order (checked first)."""
        names = self.table.check((name, tuple(shape)) for name, _, shape in description)
        body = {"names": names, "dtypes": [dtype for _, dtype, _ in description],
                "shapes": [list(shape) for _, _, shape in description], "group_name": group_name,
                "flush_cache": False, "weight_version": str(weight_version),
                "load_format": load_format if load_format != "per_tensor" else None}
        await asyncio.gather(*(self._weight_update(server, "/update_weights_from_distributed", body, weight_version)
                               for server in self.usable_servers()))
        self.journal.lost_track("the distributed weight-update group (--weight-sync sglang-distributed)")
        self._weight_version = weight_version

    def check_description(self, description: list[tuple[str, str, list[int]]]) -> list[str]:
        """Check a bucket's ``(name, dtype, shape)`` list against the served model; the names to send."""
        return self.table.check((name, tuple(shape)) for name, _, shape in description)

    def stats(self) -> dict[str, float]:
        """Cumulative counters: ``requests``, ``aborted``, ``prompt_tokens``, ``generated_tokens``,
        ``retries`` (requests sent again after a server failed), ``continuations`` (requests
        continued past an end-of-sequence token not asked for), ``busy_seconds`` (time with at
        least one request in flight), ``restarts``, and ``tokens_per_second`` (per busy second)."""
        stats = dict(self._stats)
        if self._busy_since is not None:
            stats["busy_seconds"] += time.perf_counter() - self._busy_since
        stats["restarts"] = float(sum(server.restarts for server in self.servers))
        stats["tokens_per_second"] = stats["generated_tokens"] / stats["busy_seconds"] if stats["busy_seconds"] else 0.0
        return {key: float(value) for key, value in stats.items()}

    # ----------------------------------------------------------------------------------------
    # Generation
    # ----------------------------------------------------------------------------------------

    async def _generate(self, ticket: _Ticket, prompt_ids: list[int], params: SamplingParams) -> GenerationOutput:
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
                    raise ProviderError(f"sglang generate: {server.name} did not answer ({exc}), "
                                        f"{self.retries} retries used (--sglang-request-retries)",
                                        provider="sglang", plugin="plasmid-sglang") from exc
                self._stats["retries"] += 1
                self._suspect(server)
                await asyncio.sleep(backoff(attempt))
                if not any(other.healthy.is_set() for other in self._reachable()):
                    await self.pool.wait_usable(server, self.startup_timeout + 60)
            finally:
                server.in_flight -= 1

    async def _generate_on(self, server: Server, ticket: _Ticket, prompt_ids: list[int],
                           params: SamplingParams) -> GenerationOutput:
        """Generate on ``server``, continuing past end-of-sequence tokens not asked for."""
        tokens: list[int] = []
        logprobs: list[float] = []
        status, version = Status.ABORTED, self._weight_version
        routed: list[list[list[int]]] | None = None
        while not ticket.aborted:
            context = prompt_ids + tokens
            body = generate_request(context, params, params.max_new_tokens - len(tokens), self.routing is not None)
            http_status, text = await request(self._generate_url(server), "/generate", body,
                                              timeout=self.request_timeout)
            generated = parse_generate(self._generate_answer(server, http_status, text, len(context),
                                                             params.max_new_tokens - len(tokens)))
            if self.routing is not None:     # covers the whole context + answer: the last answer's is complete
                routed = self.routing.decode(generated.routed_experts, len(context) + len(generated.token_ids) - 1)
            tokens += generated.token_ids
            logprobs += generated.logprobs
            status, version = generated.status, generated.weight_version
            if not needs_continuation(generated, params):
                break
            if len(tokens) >= params.max_new_tokens:
                status = Status.TRUNCATED
                break
            self._stats["continuations"] += 1
        return GenerationOutput(tokens, logprobs, status, version, routed)

    def _generate_url(self, server: Server) -> str:
        """Where ``/generate`` goes: the router when there is one (it picks the server), else ``server``."""
        return self.router.url if self.router is not None else server.url

    def _generate_answer(self, server: Server, status: int, text: str, prompt_tokens: int,
                         new_tokens: int) -> dict[str, Any]:
        """The JSON answer of a ``/generate`` call of ``prompt_tokens`` and ``new_tokens``; a
        refusal for length (SGLang answers HTTP 400, "... exceeds the model's maximum context
        length of N tokens ...") is a :class:`ContextLengthError` naming both lengths, never retried."""
        if self.router is not None and status in (502, 503, 504):
            raise ServerUnreachable(f"the SGLang router answered HTTP {status}: {text.strip()[:200]}")
        refused = ContextLengthError.from_server(text, prompt_tokens, new_tokens, where=f"sglang generate: "
                                                 f"{server.name}") if status == 400 else None
        if refused is not None:
            raise refused
        if status != 200:
            raise ProviderError(f"sglang generate: {server.name} answered HTTP {status}: {text.strip()[:500]}",
                                provider="sglang", plugin="plasmid-sglang")
        return json.loads(text)

    # ----------------------------------------------------------------------------------------
    # Control calls
    # ----------------------------------------------------------------------------------------

    async def _control(self, server: Server, path: str, body: dict[str, Any]) -> Any:
        """A control call that must succeed, waiting for the server when it is being restarted."""

        async def call(server: Server) -> Any:
            status, text = await request(server.url, path, body)
            return expect_success(server.url, path, status, text)

        return await self._with_recovery(server, call)

    async def _weight_update(self, server: Server, path: str, body: dict[str, Any], weight_version: int,
                             session: bool = True) -> None:
        """One weight update of ``server``, inside a begin/end weight-update session (``session``):
        the version read back and the prefix cache flushed. When requests are in flight on it,
        generation is paused around it in SGLang's ``retract`` mode: running requests go back to
        the queue and recompute their context with the new weights when generation continues (a
        paused-in-place request would keep its KV cache, and SGLang cannot flush a cache that a
        running request holds). SGLang's own flush after an update gives up when any request runs,
        even the health monitor's one-token check, so the flush is plasmid's, retried."""

        async def call(path: str, body: dict[str, Any]) -> Any:
            status, text = await request(server.url, path, body)
            return expect_success(server.url, path, status, text)

        async with self.pool.update_lock(server):
            paused = bool(self._tickets) if self.router is not None else server.in_flight > 0
            if paused:
                await call("/pause_generation", {"mode": "retract"})
            try:
                if session:
                    await call("/begin_weight_update", {})
                try:
                    await call(path, body)
                finally:
                    if session:
                        await call("/end_weight_update", {})
                status, text = await request(server.url, "/model_info", method="GET")
                served = expect_success(server.url, "/model_info", status, text).get("weight_version")
                if parse_version(served) != weight_version:
                    raise ServerCallFailed(f"{server.name}: after {path} with weight_version {weight_version} the "
                                           f"server reports version {served!r}")
                await self._flush(server)
            finally:
                if paused:
                    await call("/continue_generation", {})

    async def _flush(self, server: Server) -> None:
        deadline = time.monotonic() + self.flush_timeout
        delay = 0.02
        while True:
            status, text = await request(server.url, "/flush_cache", {})
            if status == 200:
                return
            if time.monotonic() > deadline:
                raise ProviderError(f"sglang flush_cache: {server.name} refused to flush for "
                                    f"{self.flush_timeout:.0f} s (it flushes only when no request runs; last "
                                    f"answer HTTP {status}: {text.strip()[:200]}); stale prefix-cache entries "
                                    f"would give wrong log-probs",
                                    provider="sglang", plugin="plasmid-sglang")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    async def _abort_on(self, server: Server) -> None:
        try:
            await request(server.url, "/abort_request", {"abort_all": True}, timeout=30)
        except ServerUnreachable:
            self._suspect(server)

    async def _with_recovery(self, server: Server, call: Callable[[Server], Awaitable[Any]]) -> Any:
        """``await call(server)``; when the server does not answer, wait for its restart and call again."""
        for attempt in itertools.count():
            await self.pool.wait_usable(server, self.startup_timeout + 60)
            try:
                return await call(server)
            except ServerUnreachable as exc:
                if attempt >= self.retries:
                    raise ProviderError(f"sglang: {server.name} did not answer ({exc}), {self.retries} retries used",
                                        provider="sglang", plugin="plasmid-sglang") from exc
                self._suspect(server)
                await asyncio.sleep(backoff(attempt + 1))
        raise AssertionError("unreachable")

    def _restore(self, server: Server, old_url: str) -> None:
        """Put the engine's current weights and version on a restarted ``server`` (monitor thread),
        and its new address in the router in place of ``old_url``."""
        journal = self.journal.snapshot()
        version = self._weight_version
        if journal.lost is not None and version > 0:
            raise ProviderError(f"its weights (version {version}) came through {journal.lost} and cannot be "
                                f"restored by this engine", provider="sglang", plugin="plasmid-sglang")

        def call(path: str, body: dict[str, Any]) -> Any:
            status, text = request_blocking(server.url, path, body)
            return expect_success(server.url, path, status, text)

        if journal.disk is not None:
            call("/update_weights_from_disk", {"model_path": journal.disk, "flush_cache": False})
        for _, payload in journal.payloads:
            call("/begin_weight_update", {})
            try:
                call("/update_weights_from_tensor", {"serialized_named_tensors": [payload] * server.tp_size,
                                                     "load_format": "flattened_bucket", "flush_cache": False})
            finally:
                call("/end_weight_update", {})
        call("/update_weight_version", {"new_version": str(version), "abort_all_requests": False})
        report(f"{server.name}: restored weight version {version} ({len(journal.payloads)} buckets"
               f"{', from ' + journal.disk if journal.disk else ''})")
        if self.router is not None:
            self.router.replace_worker(old_url, server.url, self.startup_timeout)

    # ----------------------------------------------------------------------------------------
    # Helpers
    # ----------------------------------------------------------------------------------------

    def _suspect(self, server: Server) -> None:
        server.mark_suspect()
        if self.monitor is not None:
            self.monitor.wake()
        else:
            server.healthy.set()  # nobody would look at it again: retry it directly

    def usable_servers(self) -> list[Server]:
        """The servers in service (a server out of service is left out of updates and flushes);
        raises when none is."""
        usable = [server for server in self.servers if server.failure is None]
        if not usable:
            self.servers[0].check_usable()
        return usable


    def _reachable(self) -> list[Server]:
        return [server for server in self.servers if server.failure is None]

    def _can_release(self, server: Server) -> bool:
        return server.device != "cpu" and server.memory_saver

    def _started_work(self) -> None:
        if self._busy_since is None:
            self._busy_since = time.perf_counter()

    def _finished_work(self) -> None:
        if not self._tickets and self._busy_since is not None:
            self._stats["busy_seconds"] += time.perf_counter() - self._busy_since
            self._busy_since = None

    def _check_open(self, method: str) -> None:
        if self._closed:
            raise RuntimeError(f"sglang {method}: the engine was shut down; build a new one")

    def _check_tokens(self, token_ids: Sequence[int], argument: str) -> None:
        if token_ids and (min(token_ids) < 0 or max(token_ids) >= self.vocab_size):
            bad = next(t for t in token_ids if not 0 <= t < self.vocab_size)
            raise ValueError(f"sglang: {argument} holds token id {bad}, outside the vocabulary of the model at "
                             f"{self.model_path} (ids 0..{self.vocab_size - 1}); was it tokenized for another model?")


def backoff(attempt: int) -> float:
    """Seconds to wait before retry ``attempt`` (1, 2, ...) of a call that found its server silent:
    0.25, 0.5, 1, ... up to 8 (a restart is awaited separately, through the health monitor)."""
    return min(0.25 * 2 ** (attempt - 1), 8.0)
