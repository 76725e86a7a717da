"""``VLLMEngine``: a :class:`plasmid.protocols.RolloutEngine` over one vLLM server.

Built by the kernel as ``VLLMEngine(config)``. It launches one server on ``--model``
(:mod:`plasmid_vllm.server`; every ``--vllm-*`` engine argument applies), or attaches to
``--vllm-external-addrs`` (servers started with ``VLLM_SERVER_DEV_MODE=1`` and plasmid's worker
extension; requests go to the least loaded), and waits until they are healthy.

- a request whose prompt and ``max_tokens`` exceed the server's ``max_model_len`` is refused by
  vLLM (HTTP 400, "This model's maximum context length is N tokens ..."); the engine raises it as
  :class:`~plasmid.errors.ContextLengthError`, naming both lengths, and does not retry it.
- ``generate``: a streamed ``/v1/completions`` request with the prompt's token ids,
  ``return_token_ids``, the sampled token's log-prob (``logprobs: 0``), the seed, and
  ``ignore_eos`` with plasmid's ``stop_token_ids`` (a response ends on the stop tokens asked for
  only). Log-probs are vLLM's ``processed_logprobs`` (plasmid's default ``--vllm-logprobs-mode``):
  the distribution sampled from, at the request's temperature (exactly plasmid's definition when
  ``top_k <= 0`` and ``top_p >= 1``; with those filters on, vLLM reports the filtered
  distribution); greedy requests report log-probs at temperature 1.
- ``score``: ``prompt_logprobs`` of the given tokens (one generated token, ignored); vLLM computes
  them at temperature 1, so away from it every token's log-prob is asked for
  (``prompt_logprobs: -1``, with plasmid's ``--vllm-max-logprobs -1``) and rescaled exactly.
- ``abort_all``: ``/abort_requests`` (every request the server tracks); each stream ends with the
  tokens so far (``Status.ABORTED``). A stream that does not end within 2 s is closed, which
  aborts its request in vLLM too.
- ``update_weights``: the names and shapes are checked against ``--model``'s safetensors headers
  (before anything is sent; an error names the tensor), the tensors are sent as one safetensors
  payload through ``/collective_rpc`` to :meth:`plasmid_vllm.worker.PlasmidWorkerExtension.plasmid_load_weights`
  (the model's own ``load_weights``), the prefix cache is reset and ``/update_weight_version``
  records the version. A weight sync calls it bucket by bucket (plasmid-sync's ``inprocess``).
- ``load_weights_from_disk``: ``/collective_rpc`` to ``plasmid_reload_from_disk`` (vLLM's
  in-place ``reload_weights`` from the directory); the disk sync ``vllm-disk`` uses it.
- ``load_adapter``: ``/v1/load_lora_adapter`` of a LoRA adapter directory (peft's format) under
  the name ``plasmid-v<version>``; from then on requests name it (vLLM applies it on top of the
  served weights) and the adapter served before is unloaded. The adapters-only sync
  ``vllm-lora`` uses it; servers need ``--vllm-enable-lora`` (a launched one then gets
  ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``). ``update_weights`` and ``load_weights_from_disk``
  serve the plain weights again.
- ``flush_cache``: ``/reset_prefix_cache``, retried while running requests hold blocks.
- ``release_memory`` / ``resume_memory``: ``/sleep`` (level 1) and ``/wake_up`` on GPU servers
  started with ``enable_sleep_mode`` (plasmid's default with ``--placement colocate`` on a GPU);
  nothing on CPU, where vLLM has no sleep mode.
- ``get_weights``: ``/collective_rpc`` to ``plasmid_get_weights`` (cut out of fused parameters).
- health: a monitor thread (:mod:`plasmid_vllm.health`) polls ``/health`` of launched servers and
  restarts a dead one, which gets the current weights back (the last directory loaded plus the
  tensor buckets loaded since) and the current version, before it serves again.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from plasmid.config import Config
from plasmid.errors import ContextLengthError, ProviderError, UsageError
from plasmid.kernel_options import GeneralOptions, ScheduleOptions
from plasmid.options import Options
from plasmid.server_process import logprob_at_temperature, stop_servers_at_exit
from plasmid.types import GenerationOutput, SamplingParams, Status
from plasmid_vllm.client import ServerCallFailed, ServerUnreachable, expect_ok, request, request_blocking
from plasmid_vllm.options import VLLMOptions
from plasmid_vllm.server import ServerProcess, detect_device, given_native, server_argv, server_values

NamedTensor = tuple[str, Any]
#: the served name of the LoRA adapter of weight version N (:meth:`VLLMEngine.load_adapter`): this prefix, then N
ADAPTER_PREFIX = "plasmid-v"
_LAUNCHED = itertools.count()


@dataclass(eq=False)
class _Ticket:
    aborted: bool = False
    done: bool = False
    status: Status = Status.PENDING
    cancel: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(eq=False)
class Server:
    """One server: launched (``process``) or attached (``address``)."""

    index: int
    process: ServerProcess | None = None
    address: str = ""
    in_flight: int = 0
    restarts: int = 0
    failure: str | None = None
    ready: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        return self.process.url if self.process is not None else self.address

    @property
    def name(self) -> str:
        return f"vLLM server {self.index} ({self.url})"


class VLLMEngine:
    """Rollouts from vLLM servers (see the module docstring). Options: ``--model``, ``--seed``,
    ``--placement`` and the ``--vllm-*`` options."""

    option_classes: ClassVar[tuple[type[Options], ...]] = (VLLMOptions, GeneralOptions, ScheduleOptions)

    def __init__(self, config: Config) -> None:
        self.options = options = VLLMOptions.of(config)
        model = GeneralOptions.of(config).model
        if not model:
            raise UsageError("engine 'vllm' (plugin plasmid-vllm) needs --model DIR: a local Hugging Face model "
                             "directory that vLLM can serve")
        self.model_path = str(model)
        self.tensors = checkpoint_tensors(self.model_path)
        self.vocab_size = int(json.loads((Path(self.model_path) / "config.json").read_text()).get("vocab_size", 0))
        self.tied = "lm_head.weight" not in self.tensors
        self._weight_version = 0
        self._tickets: set[_Ticket] = set()
        self._stats = {"requests": 0, "aborted": 0, "prompt_tokens": 0, "generated_tokens": 0, "busy_seconds": 0.0}
        self._busy_since: float | None = None
        self._closed = False
        # ("disk", path), ("tensors", payload), ("adapter", json [name, path]) since the last disk load
        self._journal: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self.served_model = self.model_path
        addresses = options.external_addresses
        self.servers = self._attach(addresses) if addresses else self._launch(config)
        #: the served model's own name (requests name it unless an adapter is served, :meth:`load_adapter`)
        self.base_model_name = self.served_model
        self._semaphores: dict[int, asyncio.Semaphore] = {}
        self._monitor: threading.Thread | None = None
        self._stop_monitor = threading.Event()
        if options.vllm_health_interval > 0 and not addresses:
            self._monitor = threading.Thread(target=self._watch, name="plasmid-vllm-health", daemon=True)
            self._monitor.start()

    # ------------------------------------------------------------------------------------ building

    def _launch(self, config: Config) -> list[Server]:
        ordinal = next(_LAUNCHED)
        device = str(given_native(config).get("device") or detect_device())
        values = server_values(config, self.model_path, ordinal, device)
        port = values.pop("port", None)
        env = self.options.server_env
        if values.get("enable_lora"):       # load_adapter's /v1/load_lora_adapter exists only with it
            env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", **env}
        process = ServerProcess(self.model_path, server_argv(values), env,
                                self.options.log_dir(config.run_dir) / f"server-{ordinal}.log", device,
                                fixed_port=int(port) if port else None)
        server = Server(0, process=process)
        stop_servers_at_exit(self, [server], lambda engine: engine._closed)
        process.start()
        try:
            process.wait_healthy(self.options.vllm_startup_timeout)
        except BaseException:
            process.stop()
            raise
        server.ready.set()
        return [server]

    def _attach(self, addresses: list[str]) -> list[Server]:
        servers = []
        for index, address in enumerate(addresses):
            url = (address if address.startswith("http") else f"http://{address}").rstrip("/")
            try:
                status, text = request_blocking(url, "/v1/models", method="GET", timeout=60)
            except ServerUnreachable as exc:
                raise ProviderError(f"--vllm-external-addrs {address}: no vLLM server answers there ({exc})",
                                    provider="vllm", plugin="plasmid-vllm") from exc
            models = expect_ok(url, "/v1/models", status, text).get("data") or [{}]
            self.served_model = str(models[0].get("id") or self.model_path)
            status, _ = request_blocking(url, "/weight_info", method="GET", timeout=60)
            if status != 200:
                raise ProviderError(f"--vllm-external-addrs {address}: the server has no /weight_info; start it with "
                                    f"VLLM_SERVER_DEV_MODE=1 and --worker-extension-cls "
                                    f"plasmid_vllm.worker.PlasmidWorkerExtension", provider="vllm",
                                    plugin="plasmid-vllm")
            server = Server(index, address=url)
            server.ready.set()
            servers.append(server)
        return servers

    # ------------------------------------------------------------------------------ RolloutEngine

    @property
    def weight_version(self) -> int:
        return self._weight_version

    @property
    def restarts(self) -> int:
        return sum(server.restarts for server in self.servers)

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerationOutput:
        """Sample one response (see the module docstring).

        :raises ValueError: an empty prompt or a token id outside the vocabulary.
        :raises ProviderError: the server failed the request or stayed out of reach.
        """
        self._check_open("generate")
        self._check_tokens(prompt_ids, "prompt_ids")
        if not prompt_ids:
            raise ValueError("vllm generate: prompt_ids is empty; a response needs at least one prompt token")
        ticket = _Ticket()
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

    async def score(self, token_ids: list[int], prompt_length: int, temperature: float) -> list[float]:
        """Log-probs of ``token_ids[prompt_length:]`` at ``temperature`` (0 counts as 1)."""
        self._check_open("score")
        self._check_tokens(token_ids, "token_ids")
        if not 1 <= prompt_length <= len(token_ids):
            raise ValueError(f"vllm score: prompt_length must be in [1, {len(token_ids)}] (the number of tokens), "
                             f"got {prompt_length}")
        if prompt_length == len(token_ids):
            return []
        exact = temperature in (0.0, 1.0)
        body = {"model": self.served_model, "prompt": list(token_ids), "max_tokens": 1, "temperature": 0.0,
                "prompt_logprobs": 0 if exact else -1, "return_tokens_as_token_ids": True, "ignore_eos": True}
        server = await self._choose()
        status, text = await self._call(server, "/v1/completions", body)
        refused = ContextLengthError.from_server(text, len(token_ids), 1, where=f"vllm score: {server.name}") \
            if status == 400 else None
        if refused is not None:
            raise refused
        rows = expect_ok(server.url, "/v1/completions", status, text)["choices"][0]["prompt_logprobs"]
        values = []
        for position in range(prompt_length, len(token_ids)):
            row = {int(key): float(entry["logprob"]) for key, entry in rows[position].items()}
            token = token_ids[position]
            values.append(row[token] if exact else logprob_at_temperature(row, token, temperature))
        return values

    async def abort_all(self) -> int:
        """Abort every request in flight; returns how many ended ABORTED."""
        self._check_open("abort_all")
        targets = [t for t in self._tickets if not t.done]
        for ticket in targets:
            ticket.aborted = True
        if targets:
            await asyncio.gather(*(self._abort_on(server) for server in self.servers if server.failure is None))
            deadline = time.monotonic() + 2.0
            while any(not t.done for t in targets) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            for ticket in targets:
                ticket.cancel.set()  # close streams that have not ended: vLLM aborts them too
            while any(not t.done for t in targets):
                await asyncio.sleep(0.01)
        return sum(t.status is Status.ABORTED for t in targets)

    async def update_weights(self, named_tensors: Iterable[NamedTensor], weight_version: int) -> None:
        """Load ``(Hugging Face name, torch tensor or numpy array)`` pairs (a subset is fine) into
        every server and set ``weight_version``.

        :raises ValueError: a name the model does not have or a shape that differs from the
            served tensor's (the message names it); checked before anything is sent.
        """
        from plasmid_torch.tensors import as_torch
        from plasmid_vllm.worker import encode_tensors

        self._check_open("update_weights")
        named = [(name, as_torch(value)) for name, value in named_tensors]
        if not named:
            return
        for name, tensor in named:
            self._check_shape(name, tuple(tensor.shape))
        await self._drop_adapter()
        loop = asyncio.get_running_loop()
        payload = await loop.run_in_executor(None, encode_tensors, dict(named))
        await self._on_all(lambda server: self._rpc(server, "plasmid_load_weights", payload))
        with self._lock:
            self._journal.append(("tensors", payload))
        await self._set_version(weight_version)

    async def load_weights_from_disk(self, path: str, weight_version: int) -> None:
        """Reload every weight from the Hugging Face checkpoint in ``path`` (vLLM's in-place
        reload) on every server, and set the version."""
        self._check_open("load_weights_from_disk")
        await self._drop_adapter()
        await self._on_all(lambda server: self._rpc(server, "plasmid_reload_from_disk", str(path)))
        with self._lock:
            self._journal = [("disk", str(path))]
        await self._set_version(weight_version)

    async def load_adapter(self, path: str, weight_version: int) -> None:
        """Serve the LoRA adapter in directory ``path`` (peft's format: ``adapter_config.json``,
        ``adapter_model.safetensors``, trained on ``--model``) on top of the served weights, from
        now on, on every server, and set ``weight_version``: loaded under the name
        ``plasmid-v<weight_version>`` (a new name per version: requests in flight keep the adapter
        they started with, and vLLM keys prefix-cache blocks by adapter), then the adapter served
        before is unloaded. The same version again (a restarted engine catching up) only records it.

        :raises ServerCallFailed: vLLM refused the adapter (a server without ``--vllm-enable-lora``,
            a rank above ``--vllm-max-lora-rank``, modules vLLM cannot adapt: vLLM's message).
        """
        self._check_open("load_adapter")
        name = f"{ADAPTER_PREFIX}{weight_version}"
        previous = self.served_model
        if name != previous:
            await self._on_all(lambda server: self._control(server, "/v1/load_lora_adapter",
                                                            {"lora_name": name, "lora_path": str(path)}))
            self.served_model = name
            with self._lock:
                self._journal = [entry for entry in self._journal if entry[0] != "adapter"]
                self._journal.append(("adapter", json.dumps([name, str(path)])))
            if previous != self.base_model_name:
                await self._on_all(lambda server: self._control(server, "/v1/unload_lora_adapter",
                                                                {"lora_name": previous}))
        await self._set_version(weight_version)

    async def _drop_adapter(self) -> None:
        """Serve the plain weights again (unload the adapter :meth:`load_adapter` served, if any)."""
        adapter = self.served_model
        if adapter == self.base_model_name:
            return
        self.served_model = self.base_model_name
        with self._lock:
            self._journal = [entry for entry in self._journal if entry[0] != "adapter"]
        await self._on_all(lambda server: self._control(server, "/v1/unload_lora_adapter", {"lora_name": adapter}))

    async def get_weights(self, names: Sequence[str]) -> dict[str, Any]:
        """The served values of the named tensors as numpy arrays (dtype as served)."""
        from plasmid_vllm.worker import decode_tensors

        self._check_open("get_weights")
        for name in names:
            self._check_shape(name, None)
        server = await self._choose()
        text = await self._rpc(server, "plasmid_get_weights", json.dumps(list(names)))
        tensors = decode_tensors(text)
        return {name: tensors[name].numpy() for name in names}

    async def flush_cache(self) -> None:
        """Reset every server's prefix cache, retrying (up to 60 s) while running requests hold blocks."""
        self._check_open("flush_cache")
        await self._on_all(self._flush)

    async def release_memory(self) -> None:
        """``/sleep`` level 1 on GPU servers with sleep mode; nothing on CPU (no sleep mode there)."""
        self._check_open("release_memory")
        await self._on_all(lambda s: self._control(s, "/sleep?level=1"), only=self._can_sleep)

    async def resume_memory(self) -> None:
        """``/wake_up`` (weights and KV cache) where ``release_memory`` slept."""
        self._check_open("resume_memory")
        await self._on_all(lambda s: self._control(s, "/wake_up"), only=self._can_sleep)

    async def shutdown(self) -> None:
        """Abort what runs and stop the launched server; later calls raise."""
        if self._closed:
            return
        try:
            if self._tickets:
                await self.abort_all()
        finally:
            self.close()

    def close(self) -> None:
        """Stop the monitor and the launched servers now (blocking; also run at exit)."""
        self._closed = True
        self._stop_monitor.set()
        for server in self.servers:
            if server.process is not None:
                server.process.stop()

    async def note_external_update(self, weight_version: int, how: str) -> None:
        """Weights reached the servers without this engine (``--weight-sync vllm-nccl``): reset the
        prefix caches and record ``weight_version``; a restarted server cannot get them back."""
        with self._lock:
            self._journal = [("lost", how)]
        await self._on_all(self._flush)
        self._weight_version = weight_version

    def stats(self) -> dict[str, float]:
        """Cumulative counters: ``requests``, ``aborted``, ``prompt_tokens``, ``generated_tokens``,
        ``busy_seconds``, ``restarts`` and ``tokens_per_second`` (per busy second)."""
        stats = dict(self._stats)
        if self._busy_since is not None:
            stats["busy_seconds"] += time.perf_counter() - self._busy_since
        stats["restarts"] = float(self.restarts)
        stats["tokens_per_second"] = stats["generated_tokens"] / stats["busy_seconds"] if stats["busy_seconds"] else 0.0
        return {key: float(value) for key, value in stats.items()}

    # ---------------------------------------------------------------------------------- generation

    async def _generate(self, ticket: _Ticket, prompt_ids: list[int], params: SamplingParams) -> GenerationOutput:
        body: dict[str, Any] = {
            "model": self.served_model, "prompt": prompt_ids, "max_tokens": params.max_new_tokens,
            "temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k if params.top_k > 0 else 0,
            "logprobs": 0, "return_token_ids": True, "return_tokens_as_token_ids": True, "ignore_eos": True,
            "stop_token_ids": list(params.stop_token_ids), "stream": True, "skip_special_tokens": False}
        if params.seed is not None:
            body["seed"] = params.seed
        for attempt in itertools.count():
            server = await self._choose()
            tokens: list[int] = []
            logprobs: list[float] = []
            try:
                finish = await self._stream(server, ticket, body, tokens, logprobs)
            except ServerUnreachable as exc:
                if ticket.aborted:
                    return GenerationOutput(tokens, logprobs, Status.ABORTED, self._weight_version)
                if attempt >= self.options.vllm_request_retries:
                    raise ProviderError(f"vllm generate: {server.name} did not answer ({exc}), "
                                        f"{self.options.vllm_request_retries} retries used (--vllm-request-retries)",
                                        provider="vllm", plugin="plasmid-vllm") from exc
                server.ready.clear()
                await asyncio.sleep(min(0.25 * 2 ** attempt, 8.0))
                continue
            if ticket.aborted or finish == "abort":
                status = Status.ABORTED
            elif finish == "stop" or (tokens and tokens[-1] in params.stop_token_ids):
                status = Status.COMPLETED
            else:
                status = Status.TRUNCATED
            return GenerationOutput(tokens, logprobs, status, self._weight_version)
        raise AssertionError("unreachable")

    async def _stream(self, server: Server, ticket: _Ticket, body: dict[str, Any], tokens: list[int],
                      logprobs: list[float]) -> str | None:
        """Run one streamed completion, appending to ``tokens`` and ``logprobs``; its finish reason."""
        import aiohttp

        finish: str | None = None
        semaphore = self._semaphore(server)
        async with semaphore:
            server.in_flight += 1
            try:
                timeout = aiohttp.ClientTimeout(total=self.options.vllm_request_timeout)
                async with aiohttp.ClientSession(timeout=timeout) as session:
                    reader = asyncio.ensure_future(self._read(session, server, body, tokens, logprobs))
                    cancel = asyncio.ensure_future(ticket.cancel.wait())
                    try:
                        await asyncio.wait({reader, cancel}, return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        cancel.cancel()
                    if not reader.done():
                        reader.cancel()
                        return "abort"
                    finish = reader.result()
            except (TimeoutError, aiohttp.ClientConnectionError) as exc:
                raise ServerUnreachable(f"POST {server.url}/v1/completions: {type(exc).__name__}: {exc}") from exc
            finally:
                server.in_flight -= 1
        return finish

    async def _read(self, session: Any, server: Server, body: dict[str, Any], tokens: list[int],
                    logprobs: list[float]) -> str | None:
        finish = None
        async with session.post(server.url + "/v1/completions", json=body) as response:
            if response.status != 200:
                text = await response.text()
                refused = ContextLengthError.from_server(text, len(body["prompt"]), body["max_tokens"],
                                                         where=f"vllm generate: {server.name}") \
                    if response.status == 400 else None
                if refused is not None:  # vLLM's 400 for a prompt and max_tokens past max_model_len
                    raise refused
                raise ProviderError(f"vllm generate: {server.name} answered HTTP {response.status}: {text[:500]}",
                                    provider="vllm", plugin="plasmid-vllm")
            async for raw in response.content:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    raise ProviderError(f"vllm generate: {server.name}: {chunk['error']}", provider="vllm",
                                        plugin="plasmid-vllm")
                for choice in chunk.get("choices", []):
                    ids = choice.get("token_ids") or []
                    values = (choice.get("logprobs") or {}).get("token_logprobs") or []
                    if len(values) != len(ids):
                        raise ProviderError(f"vllm generate: {server.name} sent {len(ids)} tokens with {len(values)} "
                                            f"log-probs", provider="vllm", plugin="plasmid-vllm")
                    tokens += [int(t) for t in ids]
                    logprobs += [float(v) for v in values]
                    finish = choice.get("finish_reason") or finish
        return finish

    # ------------------------------------------------------------------------------------ helpers

    def _semaphore(self, server: Server) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        key = id(loop) * 1000 + server.index
        if key not in self._semaphores:
            self._semaphores[key] = asyncio.Semaphore(self.options.vllm_max_concurrency)
        return self._semaphores[key]

    async def _choose(self) -> Server:
        """The least loaded server in service; waits (up to the start-up timeout) for a restart."""
        deadline = time.monotonic() + self.options.vllm_startup_timeout + 60
        while True:
            usable = [s for s in self.servers if s.failure is None and s.ready.is_set()]
            if usable:
                return min(usable, key=lambda s: s.in_flight)
            if all(s.failure is not None for s in self.servers):
                raise ProviderError(f"vllm: every server is out of service ({self.servers[0].failure})",
                                    provider="vllm", plugin="plasmid-vllm")
            if time.monotonic() > deadline:
                raise ProviderError("vllm: no server became ready again in time", provider="vllm",
                                    plugin="plasmid-vllm")
            await asyncio.sleep(0.1)

    async def _call(self, server: Server, path: str, body: dict[str, Any] | None) -> tuple[int, str]:
        for attempt in itertools.count():
            try:
                return await request(server.url, path, body, timeout=self.options.vllm_request_timeout)
            except ServerUnreachable as exc:
                if attempt >= self.options.vllm_request_retries:
                    raise ProviderError(f"vllm: {server.name} did not answer {path} ({exc})", provider="vllm",
                                        plugin="plasmid-vllm") from exc
                server.ready.clear()
                await asyncio.sleep(min(0.25 * 2 ** attempt, 8.0))
                await self._choose()
        raise AssertionError("unreachable")

    async def _control(self, server: Server, path: str, body: dict[str, Any] | None = None) -> Any:
        status, text = await self._call(server, path, body or {})
        return expect_ok(server.url, path.split("?")[0], status, text)

    async def _rpc(self, server: Server, method: str, *args: str, kwargs: dict[str, str] | None = None) -> Any:
        """``/collective_rpc`` of ``method``; the first worker's result."""
        answer = await self._control(server, "/collective_rpc", {"method": method, "args": list(args),
                                                                 "kwargs": kwargs or {}})
        results = answer.get("results") if isinstance(answer, dict) else None
        return results[0] if results else None

    async def _on_all(self, call: Any, only: Any = None) -> None:
        servers = [s for s in self.servers if s.failure is None and (only is None or only(s))]
        await asyncio.gather(*(call(server) for server in servers))

    async def _set_version(self, weight_version: int) -> None:
        await self._on_all(self._flush)
        await self._on_all(lambda s: self._control(s, "/update_weight_version", {"new_version": str(weight_version)}))
        self._weight_version = weight_version

    async def _flush(self, server: Server) -> None:
        deadline = time.monotonic() + 60.0
        while True:
            status, text = await self._call(server, "/reset_prefix_cache", {})
            if status == 200 and json.loads(text or "{}").get("success", True):
                return
            if time.monotonic() > deadline:
                raise ServerCallFailed(f"vllm flush_cache: {server.name} refused to reset its prefix cache for 60 s "
                                       f"(last answer HTTP {status}: {text.strip()[:200]}); stale cache entries "
                                       f"would give wrong log-probs")
            await asyncio.sleep(0.05)

    async def _abort_on(self, server: Server) -> None:
        try:
            await request(server.url, "/abort_requests", {}, timeout=30)
        except ServerUnreachable:
            pass

    def _can_sleep(self, server: Server) -> bool:
        return server.process is not None and server.process.device != "cpu" \
            and "--enable-sleep-mode" in server.process.argv

    def _check_open(self, method: str) -> None:
        if self._closed:
            raise RuntimeError(f"vllm {method}: the engine was shut down; build a new one")

    def _check_tokens(self, token_ids: Sequence[int], argument: str) -> None:
        if token_ids and (min(token_ids) < 0 or max(token_ids) >= self.vocab_size):
            bad = next(t for t in token_ids if not 0 <= t < self.vocab_size)
            raise ValueError(f"vllm: {argument} holds token id {bad}, outside the vocabulary of the model at "
                             f"{self.model_path} (ids 0..{self.vocab_size - 1})")

    def _check_shape(self, name: str, shape: tuple[int, ...] | None) -> None:
        served = "model.embed_tokens.weight" if self.tied and name == "lm_head.weight" else name
        if served not in self.tensors:
            raise ValueError(f"engine 'vllm': {name!r} is not a tensor of the model at {self.model_path}")
        if shape is not None and tuple(shape) != self.tensors[served]:
            raise ValueError(f"engine 'vllm': {name} has shape {tuple(shape)}, but the served tensor is "
                             f"{self.tensors[served]} (model {self.model_path})")

    # ------------------------------------------------------------------------------------- health

    def _watch(self) -> None:
        """The health monitor (a thread): restart a launched server that died or stopped answering."""
        interval = self.options.vllm_health_interval
        while not self._stop_monitor.wait(interval):
            for server in self.servers:
                if server.process is None or server.failure is not None:
                    continue
                if self._healthy(server):
                    server.ready.set()
                    continue
                server.ready.clear()
                if self._stop_monitor.is_set():
                    return
                self._restart(server)

    def _healthy(self, server: Server) -> bool:
        if server.process is None or not server.process.alive():
            return False
        try:
            return request_blocking(server.url, "/health", method="GET", timeout=30)[0] == 200
        except ServerUnreachable:
            return False

    def _restart(self, server: Server) -> None:
        assert server.process is not None
        if server.restarts >= self.options.vllm_max_restarts:
            server.failure = f"{server.name} died and --vllm-max-restarts {self.options.vllm_max_restarts} were used"
            return
        server.restarts += 1
        print(f"plasmid-vllm: {server.name} is not healthy; restart {server.restarts}", flush=True)
        try:
            server.process.stop(grace=2.0)
            server.process.start()
            server.process.wait_healthy(self.options.vllm_startup_timeout)
            self._restore(server)
        except Exception as exc:  # noqa: BLE001 (the monitor must not die; the server is out of service)
            server.failure = f"{server.name} failed to restart: {exc}"
            return
        server.ready.set()

    def _restore(self, server: Server) -> None:
        """Give a restarted server the engine's weights and version (monitor thread)."""
        with self._lock:
            journal = list(self._journal)

        def rpc(method: str, args: list[str], kwargs: dict[str, str]) -> None:
            status, text = request_blocking(server.url, "/collective_rpc",
                                            {"method": method, "args": args, "kwargs": kwargs})
            expect_ok(server.url, "/collective_rpc", status, text)

        for kind, value in journal:
            if kind == "lost" and self._weight_version > 0:
                raise ProviderError(f"its weights (version {self._weight_version}) came through {value} and cannot "
                                    f"be restored by this engine", provider="vllm", plugin="plasmid-vllm")
            if kind == "disk":
                rpc("plasmid_reload_from_disk", [value], {})
            elif kind == "tensors":
                rpc("plasmid_load_weights", [value], {})
            elif kind == "adapter":
                name, path = json.loads(value)
                status, text = request_blocking(server.url, "/v1/load_lora_adapter",
                                                {"lora_name": name, "lora_path": path})
                expect_ok(server.url, "/v1/load_lora_adapter", status, text)
        status, text = request_blocking(server.url, "/update_weight_version",
                                        {"new_version": str(self._weight_version)})
        expect_ok(server.url, "/update_weight_version", status, text)


def checkpoint_tensors(model_dir: str) -> dict[str, tuple[int, ...]]:
    """``{name: shape}`` of every tensor in ``model_dir``'s safetensors files (headers only).

    :raises FileNotFoundError: no safetensors file there (updates are checked against them).
    """
    from safetensors import safe_open

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"engine 'vllm': no *.safetensors files in {model_dir}; plasmid checks weight "
                                f"updates against the checkpoint's tensors")
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        with safe_open(str(file), framework="numpy") as handle:
            for name in handle.keys():
                shapes[name] = tuple(handle.get_slice(name).get_shape())
    return shapes
