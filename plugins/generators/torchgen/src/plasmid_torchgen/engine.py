"""``TorchEngine``: the embedded rollout engine (a :class:`plasmid.protocols.RolloutEngine`).

How a request flows: ``generate`` puts it in a waiting queue and awaits its future. One batcher
task per event loop (started by the first ``generate``) repeats *steps*: it admits every waiting
request (up to ``--torchgen-max-batch-size`` rows in all), and on the engine's single worker
thread runs one decoding step of the running batch followed by the prefill of the admitted
requests, which then join the running batch (continuous batching: a request waits at most one
step, never for the batch to drain). Requests that finished in the step are answered at once.

Scoring (``score``, used by teachers and reference models): calls waiting at the same time are
run as ONE left-padded forward pass (at most ``--torchgen-max-batch-size`` rows and
:data:`SCORE_TOKEN_BUDGET` padded tokens; one longer call runs alone); a scorer task per event
loop takes every waiting call each time the worker is free, so calls arriving while a pass runs
make the next one.

Concurrency: every torch call (decoding, scoring, weight copies and reads) runs on that one
worker thread, so a weight update never overlaps a decoding step, and the event loop stays free
for other coroutines (rewards, the driver) while the model computes. An ``asyncio.Lock`` held
for each step orders steps with ``abort_all`` and ``update_weights``, which therefore wait at
most one step. Weights updated while requests are in flight apply from the next step; those
requests keep the KV cache computed so far and report the version current when they finish.

The engine serves one event loop at a time; when called from a new loop (each ``asyncio.run``
makes one) it starts over there, dropping requests of the old loop, which can no longer be
answered.

Stop strings (``SamplingParams.stop``): a request ends at the token whose addition makes its text
hold one of them, checked on the tail of the response after each step (:class:`.batch.StopStrings`;
the tokenizer of ``--model`` is loaded for it by the first such request). The kept tokens end with
that token and the status is ``COMPLETED``. Requests without stop strings do no text work.

A request whose prompt and ``max_new_tokens`` do not fit the model's context
(:mod:`plasmid.model_limits`: ``max_position_embeddings``, or a smaller tokenizer limit) is refused
before it is queued, with :class:`~plasmid.errors.ContextLengthError` naming both lengths (vLLM's
words), never served past the positions the model was trained on.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import torch

from plasmid.config import Config
from plasmid.errors import ContextLengthError, ProviderError, UsageError
from plasmid.kernel_options import GeneralOptions, RolloutOptions
from plasmid.model_limits import read_model_limits
from plasmid.options import Options
from plasmid.types import GenerationOutput, SamplingParams, Status
from plasmid_torch.compute import compute_executor
from plasmid_torch.device import placement
from plasmid_torch.device_options import DeviceOptions
from plasmid_torch.vision import ImageInputs, is_vision_config
from plasmid_torchgen.batch import DecodeBatch, Request
from plasmid_torchgen.decoder import Decoder
from plasmid_torchgen.options import TorchgenOptions
from plasmid_torchgen.routing import RoutingCapture
from plasmid_torchgen.stats import EngineStats
from plasmid_torchgen.vision import ImageQueue
from plasmid_torchgen.weights import WeightTable

NamedTensor = tuple[str, Any]

#: most padded tokens (rows x longest row) in one batched ``score`` pass: its logits are
#: ``[rows, longest, vocab]``, so this bounds their memory (a single longer call still runs, alone).
SCORE_TOKEN_BUDGET = 16384

ScoreCall = tuple[list[int], int, float, "asyncio.Future[list[float]]"]


class TorchEngine:
    """Samples from a local Hugging Face causal LM, on the CPU or a GPU.

    Built by the kernel as ``TorchEngine(config)``; reads ``--model`` (the model directory),
    ``--seed`` (the generator of requests without a seed), ``--torchgen-max-batch-size``,
    ``--torchgen-decoder``, ``--torchgen-cuda-graphs`` and the "device" group it shares with
    torchtrain (:class:`plasmid_torch.device_options.DeviceOptions`:
    ``--device``, ``--precision``: bf16 serves bfloat16 weights, bf16-autocast float32 weights under
    bfloat16 autocast; ``--attn-implementation``). See :mod:`.decoder` for what runs where.
    """

    option_classes: ClassVar[tuple[type[Options], ...]] = (TorchgenOptions, GeneralOptions, DeviceOptions,
                                                           RolloutOptions)

    def __init__(self, config: Config) -> None:
        general = GeneralOptions.of(config)
        model_path = general.model
        if not model_path:
            raise UsageError("engine 'torchgen' (plugin plasmid-torchgen) needs --model DIR: a local Hugging Face "
                             "causal-LM directory (the quickstart datasource sets one)")
        self.model_path = str(model_path)
        #: device and precision of the served model (``--device``, ``--precision``)
        self.place = placement(DeviceOptions.of(config), "engine 'torchgen' (plugin plasmid-torchgen)")
        options = TorchgenOptions.of(config)
        if options.torchgen_cuda_graphs and not self.place.is_cuda:      # before loading any weights
            raise UsageError(f"engine 'torchgen' (plugin plasmid-torchgen): --torchgen-cuda-graphs needs a GPU, but "
                             f"it serves on {self.place.device}; add --device cuda, or leave the option out")
        self.model = self.place.load_causal_lm(self.model_path)
        self.model.requires_grad_(False)
        self.vocab_size: int = self.model.get_input_embeddings().num_embeddings
        #: positions the model attends over (prompt + response; plasmid.model_limits), or None if unknown
        self.context = read_model_limits(self.model_path).context
        #: a vision-language model's image inputs, rebuilt from the samples' references (else ``None``)
        self.images = ImageInputs(self.model_path) if is_vision_config(self.model.config) else None
        self.max_batch_size = options.torchgen_max_batch_size
        self._stats = EngineStats()
        shared_generator = torch.Generator(device=self.place.device).manual_seed(general.seed)
        #: seeds of the requests with images (plasmid_torchgen.vision), drawn from --seed
        self.vision_generator = torch.Generator().manual_seed(general.seed)
        self._image_queue = ImageQueue(self)
        self._decoder = Decoder(self.model, shared_generator, self.place, options.torchgen_decoder,
                                graphs=options.torchgen_cuda_graphs)
        if options.torchgen_cuda_graphs and self._decoder.decoder != "lean":
            why = self._decoder.lean_unsupported or "--torchgen-decoder hf was chosen"
            raise UsageError(f"engine 'torchgen' (plugin plasmid-torchgen): --torchgen-cuda-graphs replays the lean "
                             f"decoding step, which does not run here ({why}); leave the option out")
        #: the decoding step that runs (``--torchgen-decoder``; ``hf`` for a model ``lean`` does not support)
        self.decoder = self._decoder.decoder
        if RolloutOptions.of(config).return_routed_experts:        # plasmid_torchgen.routing
            try:
                self._decoder.routing = RoutingCapture(self.model, self.model_path)
            except ValueError as error:
                raise UsageError(str(error)) from None
        self._weights = WeightTable(self.model, self.model_path)
        self._weight_version = 0
        #: the process's compute thread, shared with a trainer in the same process (plasmid_torch.compute)
        self._worker = compute_executor()
        self._closed = False
        #: the tokenizer's decode, for stop strings (loaded by the first request that has them)
        self._decode: Any = None
        # Per-event-loop state, (re)made by _bind().
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = asyncio.Lock()
        self._wakeup = asyncio.Event()
        self._waiting: deque[Request] = deque()
        self._batch: DecodeBatch | None = None
        self._batcher: asyncio.Task | None = None
        self._abandoned = False
        self._scoring: deque[ScoreCall] = deque()
        self._scorer: asyncio.Task | None = None

    # ----------------------------------------------------------------------------------------
    # RolloutEngine
    # ----------------------------------------------------------------------------------------

    @property
    def weight_version(self) -> int:
        return self._weight_version

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerationOutput:
        """Sample one response; concurrent calls are decoded together (see the module docs).

        :raises ValueError: an empty prompt or a token id outside the vocabulary.
        :raises ContextLengthError: the prompt and ``max_new_tokens`` do not fit the model's context
            (refused before anything is generated, as vLLM refuses it).
        :raises ProviderError: the forward pass failed (every request in that step gets it).
        """
        (output,) = await self._answers(self._enqueue([prompt_ids], [params]))
        return output

    async def generate_with_images(self, prompt_ids: list[int], images: Any,
                                   params: SamplingParams) -> GenerationOutput:
        """Sample one response to a prompt with images (a :class:`plasmid_torch.vision.VisionInputs`) of a
        vision-language model; concurrent calls are decoded as one batch (:mod:`plasmid_torchgen.vision`)."""
        return await self._image_queue.generate(prompt_ids, images, params)

    async def generate_many(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[GenerationOutput]:
        """``generate(prompts[i], params[i])`` for every ``i``, in order: the requests join the
        waiting queue together (one future each, no task per request) and decode like
        concurrent ``generate`` calls.

        :raises ValueError: as :meth:`generate` (:class:`ContextLengthError` included), for the first
            bad prompt (then nothing is queued).
        :raises ProviderError: as :meth:`generate`.
        """
        return await self._answers(self._enqueue(prompts, params))

    async def _answers(self, requests: list[Request]) -> list[GenerationOutput]:
        """The answers of ``requests``, in order; the first failure is raised once all are answered.
        A cancelled caller cancels their futures (the gather does), so the batcher drops their rows
        before its next step."""
        try:
            answers = await asyncio.gather(*(request.future for request in requests), return_exceptions=True)
        except asyncio.CancelledError:
            self._abandoned = True
            raise
        for answer in answers:
            if isinstance(answer, BaseException):
                raise answer
        return list(answers)

    def _enqueue(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[Request]:
        """Check the prompts, queue one request each (in order) and make sure the batcher runs.

        :raises ValueError: the first bad prompt (empty, a token id outside the vocabulary, or
            past the context with its ``max_new_tokens``: :class:`ContextLengthError`); then
            nothing is queued.
        """
        self._check_open("generate")
        for prompt_ids, call_params in zip(prompts, params, strict=True):
            self._check_tokens(prompt_ids, "prompt_ids")
            if not prompt_ids:
                raise ValueError("torchgen generate: prompt_ids is empty; a response needs at least one prompt token "
                                 "(tokenizers of plasmid models prepend <bos>)")
            self._check_context(len(prompt_ids), call_params.max_new_tokens)
        decode = self._stop_decoder() if any(call_params.stop for call_params in params) else None
        loop = self._bind()
        requests = [Request.create(prompt_ids, call_params, loop.create_future(), self.place.device, decode)
                    for prompt_ids, call_params in zip(prompts, params, strict=True)]
        self._waiting.extend(requests)
        self._wakeup.set()
        if self._batcher is None or self._batcher.done():
            self._batcher = loop.create_task(self._serve(), name="torchgen-batcher")
            self._batcher.add_done_callback(self._batcher_stopped)
        return requests

    def _stop_decoder(self) -> Any:
        """The decode (ids to text, special tokens skipped) that stop strings are matched on: the
        tokenizer of ``--model``, loaded by the first request with stop strings."""
        if self._decode is None:
            from transformers import AutoTokenizer

            try:
                tokenizer = AutoTokenizer.from_pretrained(self.model_path)
            except (OSError, ValueError) as error:
                raise UsageError(f"engine 'torchgen' (plugin plasmid-torchgen): stop strings are matched on text, "
                                 f"but the tokenizer of --model {self.model_path} cannot be loaded: {error}") from None
            self._decode = functools.partial(tokenizer.decode, skip_special_tokens=True)
        return self._decode

    async def response_logprobs(self, token_ids: list[int], prompt_length: int, temperature: float) -> list[float]:
        """Log-probs of ``token_ids[prompt_length:]`` at ``temperature`` (0 counts as 1, as in
        :func:`plasmid_torch.ops.logprobs_from_logits`), from a forward pass without a cache shared
        with the other calls waiting at the same time (see the module docs); equal to what
        ``generate`` reported for those tokens, and to scoring the call alone, up to float rounding
        (~1e-6).

        :raises ValueError: a token id outside the vocabulary, ``prompt_length`` out of range, or
            more tokens than the model's context (:class:`ContextLengthError`).
        """
        self._check_open("score")
        self._check_tokens(token_ids, "token_ids")
        self._check_context(len(token_ids), 0)
        if not 1 <= prompt_length <= len(token_ids):
            raise ValueError(f"torchgen score: prompt_length must be in [1, {len(token_ids)}] (the number of "
                             f"tokens), got {prompt_length}")
        if prompt_length == len(token_ids):
            return []
        loop = self._bind()
        future: asyncio.Future[list[float]] = loop.create_future()
        self._scoring.append((list(token_ids), prompt_length, temperature, future))
        if self._scorer is None or self._scorer.done():
            self._scorer = loop.create_task(self._score_waiting(), name="torchgen-scorer")
        return await future

    #: the deprecated name of :meth:`response_logprobs` (see :class:`plasmid.protocols.RolloutEngine`)
    score = response_logprobs

    async def abort_all(self) -> int:
        """Answer every waiting and running request now with ``Status.ABORTED`` and the tokens
        it has so far (none for waiting ones); waits for the current step (one forward pass)."""
        self._bind()
        async with self._lock:
            requests = [*self._waiting, *(self._batch.requests if self._batch else []),
                        *self._image_queue.take_waiting()]
            self._waiting.clear()
            self._batch = None
            aborted = 0
            for request in requests:
                if request.future.done():
                    continue
                request.status = Status.ABORTED
                request.future.set_result(self._output(request))
                aborted += 1
            self._stats.requests += aborted
            self._stats.aborted += aborted
        return aborted

    async def update_weights(self, named_tensors: Iterable[NamedTensor], weight_version: int) -> None:
        """Copy ``(Hugging Face name, torch tensor or numpy array)`` pairs into the served model in
        place (a subset is fine: one bucket) and set ``weight_version``.

        With tied embeddings, ``lm_head.weight`` and ``model.embed_tokens.weight`` are one tensor;
        either name updates it. Names and shapes are all checked before anything is written.

        :raises ValueError: a name the model does not have (the message names it), or a shape
            that differs from the served tensor's.
        """
        self._check_open("update_weights")
        loop = self._bind()
        async with self._lock:
            await loop.run_in_executor(self._worker, self._weights.load, named_tensors)
            self._weight_version = weight_version

    async def share_weights(self, named_tensors: Sequence[tuple[str, Any]], weight_version: int) -> int:
        """Serve a trainer's own tensors of this process in place of the engine's copies, and set
        ``weight_version`` (:class:`plasmid.protocols.SupportsWeightSharing`; the ``inprocess`` sync
        calls it, only when no train step runs while the engine generates); the bytes now shared.
        Tensors of another dtype or device are copied (:meth:`WeightTable.share`)."""
        self._check_open("share_weights")
        loop = self._bind()
        async with self._lock:
            moves = self._weights.storage_moves
            shared: int = await loop.run_in_executor(self._worker, self._weights.share, list(named_tensors))
            if self._weights.storage_moves != moves:       # graphs recorded on the old storage go
                await loop.run_in_executor(self._worker, self._decoder.weights_moved)
            self._weight_version = weight_version
        return shared

    async def get_weights(self, names: Sequence[str]) -> dict[str, Any]:
        """Copies of the named served tensors as float32 numpy arrays (for bit-for-bit checks)."""
        self._check_open("get_weights")
        loop = self._bind()
        return await loop.run_in_executor(self._worker, self._weights.read, list(names))

    async def flush_cache(self) -> None:
        """Nothing to flush: there is no prefix cache. A KV cache lives only as long as the
        requests that computed it, so no cached prefix outlives a weight update."""

    async def release_memory(self) -> None:
        """Nothing to release: on the CPU the engine uses the host memory the trainer also uses
        (moving the weights elsewhere and back would only add copies); on a GPU its weights stay
        resident (the KV cache lives only as long as its requests)."""

    async def resume_memory(self) -> None:
        """Nothing to resume (see :meth:`release_memory`)."""

    async def shutdown(self) -> None:
        """Abort every request, stop the batcher and the worker thread; later calls raise."""
        if self._closed:
            return
        self._closed = True
        await self.abort_all()
        if self._batcher is not None:
            self._batcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._batcher
            self._batcher = None

    # ----------------------------------------------------------------------------------------
    # Metrics
    # ----------------------------------------------------------------------------------------

    def stats(self) -> dict[str, float]:
        """Cumulative counters since the engine was built (see
        :class:`plasmid_torchgen.stats.EngineStats`): ``requests``, ``aborted``,
        ``prompt_tokens``, ``shared_prompt_tokens`` (not computed: another request of the same
        prefill had the prompt), ``generated_tokens``, ``batches`` (prefill passes), ``decode_steps``,
        ``forward_rows``, ``max_batch_size``, ``busy_seconds``, and the derived
        ``mean_batch_size`` (rows per forward pass) and ``tokens_per_second`` (generated tokens
        per busy second). Diff two readings for one rollout step."""
        return self._stats.as_dict()

    # ----------------------------------------------------------------------------------------
    # The batcher
    # ----------------------------------------------------------------------------------------

    async def _serve(self) -> None:
        """Step the running batch, admitting waiting requests, until cancelled (``shutdown``)."""
        loop = asyncio.get_running_loop()
        while True:
            if self._batch is None and not self._waiting:
                self._wakeup.clear()
                await self._wakeup.wait()
                await asyncio.sleep(0)  # requests submitted in the same tick join this batch
            async with self._lock:
                admitted = self._admit()
                if self._batch is None and not admitted:
                    continue
                in_step = [*(self._batch.requests if self._batch else []), *admitted]
                drop_abandoned, self._abandoned = self._abandoned, False
                try:
                    self._batch, finished, counts = await loop.run_in_executor(
                        self._worker, self._decoder.step, self._batch, admitted, drop_abandoned)
                except Exception as error:  # noqa: BLE001 - answered to every caller in the step
                    self._batch = None
                    self._fail(in_step, error)
                    continue
                self._stats.add(counts)
                self._answer(finished)

    async def _score_waiting(self) -> None:
        """Run the waiting ``score`` calls in batched passes until none waits, then stop.

        A failed pass gives its exception to every call in it; calls whose caller stopped
        waiting are dropped before their pass."""
        loop = asyncio.get_running_loop()
        await asyncio.sleep(0)  # calls made in the same tick join the first pass
        try:
            while self._scoring:
                group = self._next_score_group()
                if not group:
                    continue
                try:
                    results = await loop.run_in_executor(
                        self._worker, self._decoder.score_batch, [(t, p, temp) for t, p, temp, _ in group])
                except Exception as error:  # noqa: BLE001 - answered to every caller in the pass
                    for *_, future in group:
                        if not future.done():
                            future.set_exception(error)
                    continue
                for (*_, future), result in zip(group, results, strict=True):
                    if not future.done():
                        future.set_result(result)
        finally:  # cancelled (the loop is closing) or a bug: nobody is left waiting forever
            while self._scoring:
                *_, future = self._scoring.popleft()
                if not future.done():
                    future.cancel()

    def _next_score_group(self) -> list[ScoreCall]:
        """Waiting calls, oldest first, while the pass stays within the row and token caps."""
        group: list[ScoreCall] = []
        width = 0
        while self._scoring and len(group) < self.max_batch_size:
            call = self._scoring[0]
            if call[3].done():  # the caller was cancelled
                self._scoring.popleft()
                continue
            wider = max(width, len(call[0]))
            if group and wider * (len(group) + 1) > SCORE_TOKEN_BUDGET:
                break
            group.append(self._scoring.popleft())
            width = wider
        return group

    def _batcher_stopped(self, batcher: asyncio.Task) -> None:
        """If the batcher died of a bug, fail its requests instead of leaving them waiting forever."""
        if batcher is not self._batcher or batcher.cancelled() or batcher.exception() is None:
            return
        self._fail([*self._waiting, *(self._batch.requests if self._batch else [])], batcher.exception())
        self._waiting.clear()
        self._batch = None

    def _admit(self) -> list[Request]:
        """Take waiting requests (dropping abandoned ones) while the batch has room."""
        if self._batch is not None and not self._batch.can_join:
            return []
        room = self.max_batch_size - (len(self._batch) if self._batch else 0)
        admitted: list[Request] = []
        while self._waiting and len(admitted) < room:
            request = self._waiting.popleft()
            if not request.abandoned:
                admitted.append(request)
        return admitted

    def _answer(self, finished: list[Request]) -> None:
        self._stats.requests += len(finished)
        for request in finished:
            if not request.future.done():
                request.future.set_result(self._output(request))

    def _output(self, request: Request) -> GenerationOutput:
        """``request``'s answer, with its routing when captured (``--return-routed-experts``)."""
        output = request.output(self._weight_version)
        if self._decoder.routing is not None:
            output.routed_experts = self._decoder.routing.take(request)
        return output

    def _fail(self, requests: list[Request], error: Exception) -> None:
        for request in requests:
            if not request.future.done():
                failure = ProviderError(f"engine 'torchgen' failed decoding with the model at {self.model_path}: "
                                        f"{type(error).__name__}: {error}", provider="torchgen",
                                        plugin="plasmid-torchgen")
                failure.__cause__ = error
                request.future.set_exception(failure)

    # ----------------------------------------------------------------------------------------
    # Helpers
    # ----------------------------------------------------------------------------------------

    def _bind(self) -> asyncio.AbstractEventLoop:
        """The running event loop; on a new one, fresh per-loop state (see the module docs)."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop = loop
            self._lock = asyncio.Lock()
            self._wakeup = asyncio.Event()
            self._waiting = deque()
            self._batch = None
            self._batcher = None
            self._scoring = deque()
            self._scorer = None
        return loop

    def _check_open(self, method: str) -> None:
        if self._closed:
            raise RuntimeError(f"torchgen {method}: the engine was shut down; build a new one")

    def _check_context(self, prompt_tokens: int, new_tokens: int) -> None:
        """Refuse a request whose ``prompt_tokens + new_tokens`` exceed the model's context."""
        if self.context is not None and prompt_tokens + new_tokens > self.context:
            raise ContextLengthError(self.context, prompt_tokens, new_tokens,
                                     where=f"engine 'torchgen' (plugin plasmid-torchgen), model {self.model_path}")

    def _check_tokens(self, token_ids: Sequence[int], argument: str) -> None:
        if token_ids and (min(token_ids) < 0 or max(token_ids) >= self.vocab_size):
            bad = next(t for t in token_ids if not 0 <= t < self.vocab_size)
            raise ValueError(f"torchgen: {argument} holds token id {bad}, outside the vocabulary of the model at "
                             f"{self.model_path} (ids 0..{self.vocab_size - 1}); was it tokenized for another model?")
