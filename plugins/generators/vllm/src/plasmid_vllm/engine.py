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
  only) and its ``stop`` strings (:func:`completion_body`). Log-probs are vLLM's
  ``processed_logprobs`` (plasmid's default ``--vllm-logprobs-mode``): the distribution sampled from,
  at the request's temperature (exactly plasmid's definition when
  ``top_k <= 0`` and ``top_p >= 1``; with those filters on, vLLM reports the filtered
  distribution); greedy requests report log-probs at temperature 1.
- ``generate_with_images``: a prompt with images (a vision-language ``--model``) goes to vLLM's
  token-in, token-out ``/inference/v1/generate`` with the images as ``content_parts``, streamed the
  same way; the prompt ids vLLM expands must be plasmid's (:mod:`plasmid_vllm.images`). A text-only
  model refuses images, naming the engine (:class:`plasmid_serving.images.ServedImages`).
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
- ``get_weights``: ``/collective_rpc`` to ``plasmid_get_weights`` (cut out of fused parameters), a
  method of plasmid's worker extension: vLLM itself cannot read weights back. A server launched
  with another ``--vllm-worker-extension-cls`` makes ``reads_weights_back`` false, and the weight
  syncs' ``--verify-sync-every`` checks the engine with the scored probe instead
  (:mod:`plasmid_torch.sync_guard`).
- ``loaded_checksums``: ``/collective_rpc`` to ``plasmid_checksums``, CRC32s of the first rows of
  served tensors computed in the worker: the weight syncs' loaded checksums (``--sync-checksums``).
- health: the monitor thread of :mod:`plasmid_serving.health` polls ``/health`` of launched servers
  and restarts a dead one, which gets the current weights back (the last directory loaded, the
  tensor buckets loaded since and the adapter served) and the current version, before it serves again.

What every engine over HTTP servers does (the pool, the monitor, retries, bookkeeping, the weight
journal) is :class:`plasmid_serving.engine.HttpEngine`; this module holds what is vLLM's.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from plasmid.config import Config
from plasmid.errors import ContextLengthError
from plasmid.kernel_options import GeneralOptions, ScheduleOptions
from plasmid.options import Options
from plasmid.types import GenerationOutput, SamplingParams, Status
from plasmid_serving.engine import BlockingCall, Bucket, HttpEngine, NamedTensor, Ticket, require_model
from plasmid_serving.health import HealthPolicy
from plasmid_serving.http import ServerUnreachable, request, request_blocking
from plasmid_serving.images import vocab_size_of
from plasmid_serving.logprobs import logprob_at_temperature
from plasmid_serving.names import EngineNames
from plasmid_serving.pool import Server
from plasmid_serving.server_process import detect_device
from plasmid_vllm.images import GENERATE_PATH, GenerateStream, generate_body
from plasmid_vllm.options import VLLMOptions
from plasmid_vllm.server import ServerProcess, given_native, has_weight_readback, server_argv, server_values


def completion_body(served_model: str, prompt_ids: list[int], params: SamplingParams) -> dict[str, Any]:
    """The streamed ``/v1/completions`` body that samples one response to ``prompt_ids`` as ``params`` says.

    Stop strings (``params.stop``) are vLLM's ``stop`` with ``include_stop_str_in_output``: vLLM ends the
    response at the token that completed one and keeps every token it sampled (the text keeps the string
    too), so the tokens are exactly the engine's.
    """
    body: dict[str, Any] = {
        "model": served_model, "prompt": prompt_ids, "max_tokens": params.max_new_tokens,
        "temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k if params.top_k > 0 else 0,
        "logprobs": 0, "return_token_ids": True, "return_tokens_as_token_ids": True, "ignore_eos": True,
        "stop_token_ids": list(params.stop_token_ids), "stream": True, "skip_special_tokens": False}
    if params.stop:
        body["stop"] = list(params.stop)
        body["include_stop_str_in_output"] = True
    if params.seed is not None:
        body["seed"] = params.seed
    return body


#: the served name of the LoRA adapter of weight version N (:meth:`VLLMEngine.load_adapter`): this prefix, then N
ADAPTER_PREFIX = "plasmid-v"
_LAUNCHED = itertools.count()


class VLLMEngine(HttpEngine):
    """Rollouts from vLLM servers (see the module docstring). Options: ``--model``, ``--seed``,
    ``--placement`` and the ``--vllm-*`` options."""

    option_classes: ClassVar[tuple[type[Options], ...]] = (VLLMOptions, GeneralOptions, ScheduleOptions)
    names = EngineNames("vLLM", "vllm", "plasmid-vllm")
    # a launched server that fails one check is restarted; attached servers are not watched
    health = HealthPolicy("/health", failures_before_restart=1, watch_attached=False, stop_grace=2.0)
    abort_call = ("/abort_requests", {})
    abort_grace = 2.0  # then streams that have not ended are closed, which aborts them in vLLM too
    flush_path = "/reset_prefix_cache"
    release_calls = (("/sleep?level=1", {}),)
    resume_calls = (("/wake_up", {}),)
    answer_keys = ("message", "error", "detail")
    answer_limit = 500
    #: whether :meth:`get_weights` works: false once a server is launched without plasmid's worker
    #: extension (:func:`plasmid_vllm.server.has_weight_readback`); attached servers must have it
    reads_weights_back = True

    def __init__(self, config: Config) -> None:
        self.options = options = VLLMOptions.of(config)
        model = require_model(config, self.names)
        self.tensors = checkpoint_tensors(model)
        vocab_size = vocab_size_of(json.loads((Path(model) / "config.json").read_text()))
        super().__init__(options, model, vocab_size, self.tensors)
        self.tied = "lm_head.weight" not in self.tensors
        self.served_model = self.model_path
        self._serve(config)
        #: the served model's own name (requests name it unless an adapter is served, :meth:`load_adapter`)
        self.base_model_name = self.served_model

    # ------------------------------------------------------------------------------------ building

    def _launch(self, config: Config) -> list[Server]:
        ordinal = next(_LAUNCHED)
        device = str(given_native(config).get("device") or detect_device())
        values = server_values(config, self.model_path, ordinal, device)
        self.reads_weights_back = self.reads_weights_back and has_weight_readback(values)
        port = values.pop("port", None)
        env = self.options.server_env
        if values.get("enable_lora"):       # load_adapter's /v1/load_lora_adapter exists only with it
            env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", **env}
        argv = server_argv(values)
        process = ServerProcess(self.model_path, argv, env,
                                self.options.log_dir(config.run_dir) / f"server-{ordinal}.log", device,
                                fixed_port=int(port) if port else None)
        server = Server(0, self.names, process=process, device=device,
                        can_release=device != "cpu" and "--enable-sleep-mode" in argv)
        return self._start_launched([server])

    def _probe(self, index: int, url: str) -> Server:
        status, text = request_blocking(url, "/v1/models", method="GET", timeout=60)
        models = self.expect(url, "/v1/models", status, text).get("data") or [{}]
        self.served_model = str(models[0].get("id") or self.model_path)
        status, _ = request_blocking(url, "/weight_info", method="GET", timeout=60)
        if status != 200:
            raise self.names.error(f"--vllm-external-addrs {url}: the server has no /weight_info; start it with "
                                   f"VLLM_SERVER_DEV_MODE=1 and --worker-extension-cls "
                                   f"plasmid_vllm.worker.PlasmidWorkerExtension")
        return Server(index, self.names, address=url)

    # ---------------------------------------------------------------------------------- generation

    async def _generate_on(self, server: Server, ticket: Ticket, prompt_ids: list[int],
                           params: SamplingParams) -> GenerationOutput:
        tokens: list[int] = []
        logprobs: list[float] = []
        if ticket.images is None:
            finish = await self._stream(server, ticket, completion_body(self.served_model, prompt_ids, params),
                                        tokens, logprobs)
        else:
            finish = await self._stream_with_images(server, ticket, prompt_ids, ticket.images, params, tokens,
                                                    logprobs)
        if ticket.aborted or finish == "abort":
            status = Status.ABORTED
        elif finish == "stop" or (tokens and tokens[-1] in params.stop_token_ids):
            status = Status.COMPLETED
        else:
            status = Status.TRUNCATED
        return GenerationOutput(tokens, logprobs, status, self._weight_version)

    async def _stream_with_images(self, server: Server, ticket: Ticket, prompt_ids: list[int], images: list[str],
                                  params: SamplingParams, tokens: list[int], logprobs: list[float]) -> str | None:
        """:meth:`_stream` of ``/inference/v1/generate`` with ``images``; the prompt ids vLLM expanded are
        checked against ``prompt_ids``."""
        body = generate_body(self.served_model, self.images.server_prompt(prompt_ids, images), images, params)
        stream = GenerateStream()

        async def read(session: Any, server: Server, body: dict[str, Any], tokens: list[int],
                       logprobs: list[float]) -> str | None:
            async with session.post(server.url + GENERATE_PATH, json=body) as response:
                if response.status != 200:
                    text = await response.text()
                    raise self.names.error(f"vllm generate: {server.name} answered HTTP {response.status} to a "
                                           f"prompt with images: {text[:500]}")
                checked = False
                async for raw in response.content:
                    try:
                        more = stream.read_line(raw.decode(), tokens, logprobs)
                    except ValueError as error:
                        raise self.names.error(f"vllm generate: {server.name}: {error}") from None
                    if not checked and stream.prompt_ids is not None:   # before any token is used
                        self.images.check_expansion(server.name, stream.prompt_ids, prompt_ids)
                        checked = True
                    if not more:
                        break
            return stream.finish

        return await self._stream(server, ticket, body, tokens, logprobs, read=read)

    async def _stream(self, server: Server, ticket: Ticket, body: dict[str, Any], tokens: list[int],
                      logprobs: list[float], read: Any = None) -> str | None:
        """Run one streamed completion, appending to ``tokens`` and ``logprobs``; its finish
        reason (``"abort"`` when ``ticket.cancel`` closed it). ``read`` reads the answer (default
        :meth:`_read`, of ``/v1/completions``)."""
        import aiohttp

        try:
            timeout = aiohttp.ClientTimeout(total=self.request_timeout)
            async with aiohttp.ClientSession(timeout=timeout) as session:
                reader = asyncio.ensure_future((read or self._read)(session, server, body, tokens, logprobs))
                cancel = asyncio.ensure_future(ticket.cancel.wait())
                try:
                    await asyncio.wait({reader, cancel}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    cancel.cancel()
                if not reader.done():
                    reader.cancel()
                    return "abort"
                finish: str | None = reader.result()
                return finish
        except (TimeoutError, aiohttp.ClientConnectionError) as exc:
            raise ServerUnreachable(f"POST {server.url}/v1/completions: {type(exc).__name__}: {exc}") from exc

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
                raise self.names.error(f"vllm generate: {server.name} answered HTTP {response.status}: {text[:500]}")
            async for raw in response.content:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    raise self.names.error(f"vllm generate: {server.name}: {chunk['error']}")
                for choice in chunk.get("choices", []):
                    ids = choice.get("token_ids") or []
                    values = (choice.get("logprobs") or {}).get("token_logprobs") or []
                    if len(values) != len(ids):
                        raise self.names.error(f"vllm generate: {server.name} sent {len(ids)} tokens with "
                                               f"{len(values)} log-probs")
                    tokens += [int(t) for t in ids]
                    logprobs += [float(v) for v in values]
                    finish = choice.get("finish_reason") or finish
        return finish

    async def _score_on(self, server: Server, token_ids: list[int], prompt_length: int,
                        temperature: float) -> list[float]:
        exact = temperature in (0.0, 1.0)
        body = {"model": self.served_model, "prompt": token_ids, "max_tokens": 1, "temperature": 0.0,
                "prompt_logprobs": 0 if exact else -1, "return_tokens_as_token_ids": True, "ignore_eos": True}
        status, text = await request(server.url, "/v1/completions", body, timeout=self.request_timeout)
        refused = ContextLengthError.from_server(text, len(token_ids), 1, where=f"vllm score: {server.name}") \
            if status == 400 else None
        if refused is not None:
            raise refused
        rows = self.expect(server.url, "/v1/completions", status, text)["choices"][0]["prompt_logprobs"]
        values = []
        for position in range(prompt_length, len(token_ids)):
            row = {int(key): float(entry["logprob"]) for key, entry in rows[position].items()}
            token = token_ids[position]
            values.append(row[token] if exact else logprob_at_temperature(row, token, temperature))
        return values

    # ------------------------------------------------------------------------------------- weights

    async def _pack(self, named: list[NamedTensor]) -> Bucket:
        """Checked against ``--model``'s safetensors headers, encoded as one safetensors payload."""
        from plasmid_torch.tensors import as_torch
        from plasmid_vllm.worker import encode_tensors

        tensors = {name: as_torch(value) for name, value in named}
        for name, tensor in tensors.items():
            self._check_shape(name, tuple(tensor.shape))
        loop = asyncio.get_running_loop()
        payload = await loop.run_in_executor(self._blocking, encode_tensors, tensors)
        return Bucket(list(tensors), payload)

    async def _load_payload_on(self, server: Server, payload: str, weight_version: int) -> None:
        await self._rpc(server, "plasmid_load_weights", payload)

    async def _load_disk_on(self, server: Server, directory: str, weight_version: int) -> None:
        await self._rpc(server, "plasmid_reload_from_disk", directory)

    async def _before_load(self) -> None:
        await self._drop_adapter()

    async def _commit_version(self, weight_version: int) -> None:
        """Reset the prefix caches, then ``/update_weight_version`` on every server."""
        await self.flush_cache()
        await asyncio.gather(*(self._control(server, "/update_weight_version", {"new_version": str(weight_version)})
                               for server in self.usable_servers()))

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
            await self._on_all("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
            self.served_model = name
            self.journal.served_adapter((name, str(path)))
            if previous != self.base_model_name:
                await self._on_all("/v1/unload_lora_adapter", {"lora_name": previous})
        await self._received(weight_version, lambda journal: None)

    async def _drop_adapter(self) -> None:
        """Serve the plain weights again (unload the adapter :meth:`load_adapter` served, if any)."""
        adapter = self.served_model
        if adapter == self.base_model_name:
            return
        self.served_model = self.base_model_name
        self.journal.served_adapter(None)
        await self._on_all("/v1/unload_lora_adapter", {"lora_name": adapter})

    async def get_weights(self, names: Sequence[str]) -> dict[str, Any]:
        """The served values of the named tensors as numpy arrays (dtype as served)."""
        from plasmid_vllm.worker import decode_tensors

        self._check_open("get_weights")
        for name in names:
            self._check_shape(name, None)
        text = await self._rpc(self.pool.choose(), "plasmid_get_weights", json.dumps(list(names)))
        tensors = decode_tensors(text)
        return {name: tensors[name].numpy() for name in names}

    async def loaded_checksums(self, requests: Sequence[tuple[str, int]]) -> dict[str, int]:
        """``{name: CRC32}`` of the first ``rows`` rows (0: all) of each named tensor as every server
        in service holds it, computed in its worker
        (:meth:`plasmid_vllm.worker.PlasmidWorkerExtension.plasmid_checksums`); where the servers
        disagree, the first that differs from the first server's is reported.

        :raises plasmid_torch.sync_guard.ReadBackUnsupported: the servers run without plasmid's worker
            extension (``reads_weights_back`` false)."""
        if not self.reads_weights_back:
            from plasmid_torch.sync_guard import ReadBackUnsupported

            raise ReadBackUnsupported("engine 'vllm': the servers run another --vllm-worker-extension-cls, so they "
                                      "cannot compute checksums of their weights")
        self._check_open("loaded_checksums")
        for name, _rows in requests:
            self._check_shape(name, None)
        argument = json.dumps([[name, rows] for name, rows in requests])
        answers = [json.loads(await self._rpc(server, "plasmid_checksums", argument))
                   for server in self.usable_servers()]
        return {name: next((a[name] for a in answers if a[name] != answers[0][name]), answers[0][name])
                for name, _ in requests}

    def _replay(self, server: Server, call: BlockingCall, version: int) -> None:
        journal = self.journal.snapshot()

        def rpc(method: str, argument: str) -> None:
            call("/collective_rpc", {"method": method, "args": [argument], "kwargs": {}})

        if journal.disk is not None:
            rpc("plasmid_reload_from_disk", journal.disk)
        for _, payload in journal.payloads:
            rpc("plasmid_load_weights", payload)
        if journal.adapter is not None:
            name, path = journal.adapter
            call("/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})
        call("/update_weight_version", {"new_version": str(version)})

    # ------------------------------------------------------------------------------------ helpers

    async def _on_all(self, path: str, body: dict[str, Any]) -> None:
        await asyncio.gather(*(self._control(server, path, body) for server in self.usable_servers()))

    async def _rpc(self, server: Server, method: str, *args: str) -> Any:
        """``/collective_rpc`` of ``method``; the first worker's result."""
        answer = await self._control(server, "/collective_rpc", {"method": method, "args": list(args), "kwargs": {}})
        results = answer.get("results") if isinstance(answer, dict) else None
        return results[0] if results else None

    def _check_shape(self, name: str, shape: tuple[int, ...] | None) -> None:
        served = "model.embed_tokens.weight" if self.tied and name == "lm_head.weight" else name
        if served not in self.tensors:
            raise ValueError(f"engine 'vllm': {name!r} is not a tensor of the model at {self.model_path}")
        if shape is not None and tuple(shape) != self.tensors[served]:
            raise ValueError(f"engine 'vllm': {name} has shape {tuple(shape)}, but the served tensor is "
                             f"{self.tensors[served]} (model {self.model_path})")


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
