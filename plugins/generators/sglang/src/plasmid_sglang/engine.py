"""``SGLangEngine``: a :class:`plasmid.protocols.RolloutEngine` over one or more SGLang servers.

Built by the kernel as ``SGLangEngine(config)``. It launches ``--sglang-servers`` servers on
``--model`` (see :mod:`plasmid_sglang.server`; every ``--sglang-*`` native option applies), or
attaches to ``--sglang-external-addrs``, and waits until they are healthy; with ``--sglang-router``
an SGLang router fronts them (:mod:`plasmid_sglang.router`).

- ``generate``: one ``/generate`` request with the prompt's token ids and log-probs (formats in
  :mod:`plasmid_sglang.requests`), on the least loaded healthy server (:mod:`plasmid_serving.pool`),
  or through the router, which picks one.
  A request that finds its server silent is sent again from its prompt with the same seed (at
  most ``--sglang-request-retries`` times, with backoff), to another healthy server or, when
  there is none, to that one once the health monitor has restarted it (:mod:`plasmid_serving.health`).
  A request whose prompt and ``max_new_tokens`` exceed the model's context is refused by SGLang
  (HTTP 400, "Requested token count exceeds the model's maximum context length of N tokens ...");
  it is raised as :class:`~plasmid.errors.ContextLengthError`, naming both lengths, not retried.
- ``generate_with_images``: the same request with the images as SGLang's ``image_data`` (data URLs)
  and one image token per image in ``input_ids``; SGLang expands them, and a prompt it expanded to
  another length than plasmid's is an error. A text-only model refuses images, naming the engine
  (:class:`plasmid_serving.images.ServedImages`).
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
  e.g. Llama; Qwen2 lacks it in 0.5.23, and the engine then raises
  :class:`plasmid_torch.sync_guard.ReadBackUnsupported`: the syncs' ``--verify-sync-every`` checks
  such an engine with the scored probe instead).

What every engine over HTTP servers does (the pool, the monitor, retries, bookkeeping, the
weight journal) is :class:`plasmid_serving.engine.HttpEngine`; this module holds what is SGLang's.
The weight syncs of :mod:`plasmid_sglang.syncs` use :meth:`SGLangEngine.load_payload`,
:meth:`SGLangEngine.load_weights_from_disk` and the distributed-group methods.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Sequence
from typing import Any, ClassVar

from plasmid.config import Config
from plasmid.errors import ContextLengthError, ProviderError
from plasmid.kernel_options import GeneralOptions, RolloutOptions, ScheduleOptions
from plasmid.options import Options
from plasmid.types import GenerationOutput, SamplingParams, Status
from plasmid_serving.engine import BlockingCall, Bucket, HttpEngine, NamedTensor, Ticket, require_model
from plasmid_serving.health import HealthPolicy
from plasmid_serving.http import ServerCallFailed, ServerUnreachable, request, request_blocking
from plasmid_serving.names import EngineNames
from plasmid_serving.pool import Server
from plasmid_sglang.options import SGLangOptions
from plasmid_sglang.requests import (
    READBACK_REFUSED,
    generate_request,
    needs_continuation,
    parse_generate,
    parse_score,
    parse_version,
    readback_refused,
    score_request,
    weights_request,
)
from plasmid_sglang.router import Router
from plasmid_sglang.routing import RoutingLayout
from plasmid_sglang.server import ServerProcess, given_native, server_fields
from plasmid_sglang.weights import TensorTable, as_torch, choose_transport, flattened_bucket, serialize

#: Servers launched by this process so far (each gets ``--seed`` plus its number as its seed).
_LAUNCHED = itertools.count()


class SGLangEngine(HttpEngine):
    """Rollouts from SGLang servers that it launches on ``--model`` or attaches to (see the module
    docstring). Options: ``--model``, ``--seed``, ``--placement`` and the ``--sglang-*`` options."""

    option_classes: ClassVar[tuple[type[Options], ...]] = (SGLangOptions, GeneralOptions, ScheduleOptions,
                                                           RolloutOptions)
    names = EngineNames("SGLang", "sglang", "plasmid-sglang")
    # /health_generate: SGLang answers it by generating one token (at once when busy generating anyway)
    health = HealthPolicy("/health_generate", failures_before_restart=3, watch_attached=True, stop_grace=15.0)
    abort_call = ("/abort_request", {"abort_all": True})
    flush_path = "/flush_cache"
    release_calls = (("/release_memory_occupation", {}),)
    resume_calls = (("/resume_memory_occupation", {"tags": ["weights"]}),
                    ("/resume_memory_occupation", {"tags": ["kv_cache"]}))

    def __init__(self, config: Config) -> None:
        self.options = options = SGLangOptions.of(config)
        model = require_model(config, self.names)
        self.table = TensorTable(model)
        super().__init__(options, model, self.table.vocab_size, self.table.tensors)
        #: ``--return-routed-experts``: the model's routing layout (plasmid_sglang.routing); ``None``: not asked
        self.routing = RoutingLayout.of_model(self.model_path) if RolloutOptions.of(config).return_routed_experts \
            else None
        self.flush_timeout = options.sglang_flush_timeout
        self.transport = options.sglang_tensor_transport
        self._stats["continuations"] = 0
        self.router: Router | None = None
        self._serve(config)

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
            servers.append(Server(index, self.names, process=process, tp_size=int(values.get("tp_size") or 1),
                                  device=str(values["device"]), can_release=bool(values.get("enable_memory_saver"))))
        return self._start_launched(servers)

    def _probe(self, index: int, url: str) -> Server:
        status, text = request_blocking(url, "/server_info", method="GET", timeout=60)
        info = self.expect(url, "/server_info", status, text)
        return Server(index, self.names, address=url, tp_size=int(info.get("tp_size") or 1),
                      device=str(info.get("device") or "cuda"), can_release=bool(info.get("enable_memory_saver")))

    def _front(self, config: Config) -> None:
        """``--sglang-router``: an SGLang router before the servers (it picks one per request)."""
        if self.options.sglang_router:
            self.router = Router(self.options.sglang_router_policy, list(self.options.sglang_router_arg),
                                 self.options.log_dir(config.run_dir) / "router.log", self.options.server_env)
            self.router.start([server.url for server in self.servers], self.startup_timeout)

    def _stop_front(self) -> None:
        if self.router is not None:
            self.router.stop()

    # ----------------------------------------------------------------------------------------
    # Generation and scoring
    # ----------------------------------------------------------------------------------------

    async def _generate_on(self, server: Server, ticket: Ticket, prompt_ids: list[int],
                           params: SamplingParams) -> GenerationOutput:
        """Generate on ``server``, continuing past end-of-sequence tokens not asked for."""
        tokens: list[int] = []
        logprobs: list[float] = []
        status, version = Status.ABORTED, self._weight_version
        routed: list[list[list[int]]] | None = None
        # with images: one image token per image in the ids sent; SGLang expands them (requests.generate_request)
        sent = prompt_ids if ticket.images is None else self.images.server_prompt(prompt_ids, ticket.images)
        while not ticket.aborted:
            context = prompt_ids + tokens
            body = generate_request(sent + tokens, params, params.max_new_tokens - len(tokens),
                                    self.routing is not None, ticket.images)
            http_status, text = await request(self._generate_url(server), "/generate", body,
                                              timeout=self.request_timeout)
            answer = self._generate_answer(server, http_status, text, len(context), params.max_new_tokens - len(tokens))
            if ticket.images is not None:
                self.images.check_expansion(server.name, int(answer.get("meta_info", {}).get("prompt_tokens", -1)),
                                            context)
            generated = parse_generate(answer)
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

    async def _score_on(self, server: Server, token_ids: list[int], prompt_length: int,
                        temperature: float) -> list[float]:
        body = score_request(token_ids, prompt_length, temperature, self.vocab_size)
        status, text = await request(self._generate_url(server), "/generate", body, timeout=self.request_timeout)
        answer = self._generate_answer(server, status, text, len(token_ids), 0)
        return parse_score(answer, token_ids, prompt_length, temperature)

    def _generate_url(self, server: Any) -> str:
        """Where ``/generate`` goes: the router when there is one (it picks the server), else ``server``."""
        return self.router.url if self.router is not None else str(server.url)

    def _generate_answer(self, server: Any, status: int, text: str, prompt_tokens: int,
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
        answer: dict[str, Any] = json.loads(text)
        return answer

    # ----------------------------------------------------------------------------------------
    # Weights
    # ----------------------------------------------------------------------------------------

    async def _pack(self, named: list[NamedTensor]) -> Bucket:
        """Checked against the checkpoint's names and shapes, packed into one flattened bucket
        (bytes, or CUDA IPC handles: ``--sglang-tensor-transport``)."""
        tensors = [(name, as_torch(value)) for name, value in named]
        names = self.table.check((name, tuple(tensor.shape)) for name, tensor in tensors)
        transport = choose_transport(self.transport, [tensor for _, tensor in tensors])
        loop = asyncio.get_running_loop()
        payload = await loop.run_in_executor(
            self._blocking, lambda: serialize(flattened_bucket(list(zip(names, [t for _, t in tensors],
                                                                        strict=True))), transport))
        lost = None if transport == "pickle" else "CUDA IPC handles (--sglang-tensor-transport cuda-ipc)"
        return Bucket(names, payload, lost)

    async def _load_payload_on(self, server: Server, payload: str, weight_version: int) -> None:
        body = {"load_format": "flattened_bucket", "flush_cache": False, "weight_version": str(weight_version),
                "serialized_named_tensors": [payload] * server.tp_size}
        await self._weight_update(server, "/update_weights_from_tensor", body, weight_version)

    async def _load_disk_on(self, server: Server, directory: str, weight_version: int) -> None:
        body = {"model_path": directory, "flush_cache": False, "weight_version": str(weight_version)}
        await self._weight_update(server, "/update_weights_from_disk", body, weight_version, session=False)

    async def get_weights(self, names: Sequence[str]) -> dict[str, Any]:
        """The served values of the named tensors as float32 numpy arrays, read from one server
        (of a tensor-parallel server, SGLang answers its first rank's part).

        :raises plasmid_torch.sync_guard.ReadBackUnsupported: the served model class has no
            ``get_weights_by_name`` (:func:`plasmid_sglang.requests.readback_refused`); the sync
            guard then checks this engine with its probe."""
        self._check_open("get_weights")
        server = self.pool.choose()
        result = {}
        for name in names:
            shape = self.table.shape_of(name)
            result[name] = await self._read_rows(server, name, max(shape[:1] or (1,)))
        return result

    async def loaded_checksums(self, requests: Sequence[tuple[str, int]]) -> dict[str, int]:
        """``{name: CRC32}`` (:func:`plasmid_torch.sync_guard.loaded_checksum`) of the first ``rows``
        rows (0: all) of each named tensor as every server in service holds it, read through
        ``/get_weights_by_name`` and computed in this process; where the servers disagree, the
        first that differs from the first server's is reported (so a mismatch is seen).

        :raises plasmid_torch.sync_guard.ReadBackUnsupported: as :meth:`get_weights`."""
        from plasmid_torch.sync_guard import loaded_checksum

        self._check_open("loaded_checksums")
        result: dict[str, int] = {}
        for name, rows in requests:
            shape = self.table.shape_of(name)
            crcs = [loaded_checksum(await self._read_rows(server, name, rows or max(shape[:1] or (1,))))
                    for server in self.usable_servers()]
            result[name] = next((crc for crc in crcs if crc != crcs[0]), crcs[0])
        return result

    async def _read_rows(self, server: Server, name: str, rows: int) -> Any:
        """The first ``rows`` rows of tensor ``name`` served by ``server`` (float32 numpy, shaped)."""
        import numpy as np

        shape = self.table.shape_of(name)

        async def call(server: Server) -> Any:
            status, text = await request(server.url, "/get_weights_by_name", weights_request(name, rows))
            if readback_refused(status, text):
                from plasmid_torch.sync_guard import ReadBackUnsupported

                raise ReadBackUnsupported(f"{server.name}: /get_weights_by_name {name}: SGLang cannot read this "
                                          f"model class's weights back ({READBACK_REFUSED!r}); the weight syncs "
                                          f"check this engine with the scored probe instead")
            if status != 200:
                raise self._failed(f"{server.name}: /get_weights_by_name {name} failed (HTTP {status}): "
                                   f"{text.strip()}; SGLang implements it for some model classes only "
                                   f"(e.g. LlamaForCausalLM; not Qwen2ForCausalLM in 0.5.23), see its log")
            return json.loads(text)

        values = np.asarray(await self._with_recovery(server, call), dtype=np.float32)
        return values.reshape((min(rows, shape[0]), *shape[1:]) if shape else shape)

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
            return self.expect(server.url, path, status, text)

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
                served = self.expect(server.url, "/model_info", status, text).get("weight_version")
                if parse_version(served) != weight_version:
                    raise self._failed(f"{server.name}: after {path} with weight_version {weight_version} the "
                                       f"server reports version {served!r}")
                await self._flush(server)
            finally:
                if paused:
                    await call("/continue_generation", {})

    def _replay(self, server: Server, call: BlockingCall, version: int) -> None:
        journal = self.journal.snapshot()
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

    def _restored(self, server: Server, old_url: str) -> None:
        if self.router is not None:
            self.router.replace_worker(old_url, server.url, self.startup_timeout)

    def _failed(self, message: str) -> ServerCallFailed:
        return ServerCallFailed(message, provider="sglang", plugin="plasmid-sglang")

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

    async def load_payload(self, names: list[str], payload: str, weight_version: int, *,
                           restorable: bool = True, lost: str | None = None) -> None:
        """Load one serialized flattened bucket (:func:`plasmid_sglang.weights.serialize`) holding
        ``names`` (already checked) into every server and set the version. ``restorable``: the
        payload carries the bytes (not CUDA handles), so the journal can replay it."""
        if not restorable and lost is None:
            lost = "CUDA IPC handles (--sglang-tensor-transport cuda-ipc)"
        await super().load_payload(names, payload, weight_version, lost=lost)

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
        how = "the distributed weight-update group (--weight-sync sglang-distributed)"
        await self._received(weight_version, lambda journal: journal.lost_track(how))

    def check_description(self, description: list[tuple[str, str, list[int]]]) -> list[str]:
        """Check a bucket's ``(name, dtype, shape)`` list against the served model; the names to send."""
        return self.table.check((name, tuple(shape)) for name, _, shape in description)

