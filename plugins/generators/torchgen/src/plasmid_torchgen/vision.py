"""torchgen's path for prompts with images (vision-language models such as Qwen2-VL).

The lean decoder and the continuous batcher take token ids only. Requests with images wait in a
queue of their own (:class:`ImageQueue`); each time the engine's worker is free, every waiting one
(up to ``--torchgen-max-batch-size``) is decoded as ONE batch by :func:`generate_batch`, on the
engine's compute thread under the engine's lock (so no weight update lands mid-batch): the prompts
left-padded to one width, their pixel values concatenated and ``image_grid_thw`` stacked in row
order, each row's multimodal rotary positions computed from its own tokens and images (Qwen2-VL's
``get_rope_index``, padding excluded), and each decoding step placing a row's new token at its
own next position (its last prompt position + 1 + tokens so far; a row's ``rope_deltas`` is in
that last position). The batch runs until its every row has ended (a stop token, or its
``max_new_tokens``); requests arriving meanwhile make the next batch. The weights are the engine's
own: a weight sync or update reaches this path as it reaches the batcher.

Sampling is the text path's (:func:`plasmid_torchgen.sampling.sample_tokens`: greedy at temperature
0, else Gumbel-max with the joint top-k/top-p rule), and every row draws its noise from a generator
of its own: seeded by ``params.seed``, or else by a seed drawn from ``--seed``'s generator when the
request is queued. So a row's tokens and log-probs depend on its prompt, images, parameters and
seed alone, never on the other rows of its batch (equal up to float rounding, ~1e-6, to the same
request decoded alone). A vision special token (image, video, vision start or end:
:func:`plasmid_torch.vision.vision_token_ids`) is never sampled, since a response holding one would
match no image; the reported log-probs are of the model's logits before that exclusion and before
top-k/top-p, at ``temperature`` (1 when greedy), as the trainer computes them. Stop strings are not
matched on this path (stop token ids are).

The ``vision`` generate function (:class:`VisionSingleTurn`, ``--generate vision``) calls it for a
sample that carries :data:`plasmid_torch.vision.VISION_KEY` in its metadata (a JSON reference to its
images, which the engine's :class:`plasmid_torch.vision.ImageInputs` turns into tensors) and the
ordinary path otherwise, so a text-only run is unchanged whichever generate function it names.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from plasmid.builtin import SingleTurn
from plasmid.protocols import RolloutView
from plasmid.types import GenerationOutput, Sample, SamplingParams
from plasmid_torch import vision
from plasmid_torch.ops import logprobs_from_logits
from plasmid_torchgen.batch import Request
from plasmid_torchgen.sampling import SamplingBatch, sample_tokens
from plasmid_torchgen.stats import EngineStats


@dataclass
class ImageRequest:
    """A queued request with images: the :class:`~plasmid_torchgen.batch.Request` (prompt, parameters,
    its own generator, the response as it grows) and the prompt's vision inputs."""

    request: Request
    images: vision.VisionInputs


def generate_batch(model: Any, requests: Sequence[Request], images: Sequence[vision.VisionInputs]) -> EngineStats:
    """Decode ``requests`` (each with its own ``generator``) with their ``images`` as one batch of the
    vision-language ``model`` (see the module docs), filling each request's ``token_ids``, ``logprobs``
    and final status. Runs until every row has ended; rows that ended stay in the batch, ignored.

    :returns: the batch's counts (one prefill, its decoding steps, rows, tokens, busy seconds)."""
    start = time.perf_counter()
    device = next(model.parameters()).device
    rows = len(requests)
    width = max(len(r.prompt_ids) for r in requests)
    pad = model.config.get_text_config().pad_token_id or 0
    input_ids = torch.full((rows, width), pad, dtype=torch.long, device=device)
    attention_mask = torch.zeros((rows, width), dtype=torch.long, device=device)
    for row, request in enumerate(requests):                   # left padding: every row ends at column -1
        input_ids[row, width - len(request.prompt_ids):] = torch.tensor(request.prompt_ids, device=device)
        attention_mask[row, width - len(request.prompt_ids):] = 1
    extra = vision.forward_inputs(model, input_ids, list(images))
    positions, _ = model.model.get_rope_index(input_ids, extra["mm_token_type_ids"],
                                              image_grid_thw=extra["image_grid_thw"], attention_mask=attention_mask)
    next_position = positions[:, :, -1:].amax(dim=0, keepdim=True) + 1              # [1, rows, 1]
    sampling = SamplingBatch([r.params for r in requests], [r.generator for r in requests])
    suppressed = vision.vision_token_ids(model.config)
    unused = torch.Generator(device=device)           # every sampled row has its own generator
    live = [True] * rows
    budget = [r.params.max_new_tokens for r in requests]
    cache = _new_cache(model)
    counts = EngineStats(batches=1, prompt_tokens=sum(len(r.prompt_ids) for r in requests), forward_rows=rows,
                         max_batch_size=rows)
    with torch.no_grad():
        output = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, cache=cache,
                       use_cache=True, logits_to_keep=1, **extra)
        while True:
            logits = output.logits[:, -1].float()                                    # [rows, vocab]
            allowed = logits.clone()
            allowed[:, suppressed] = float("-inf")
            tokens, _ = sample_tokens(allowed, sampling, unused)
            logprobs = logprobs_from_logits(logits / sampling.divisor.to(device), tokens)
            for row, (token, logprob) in enumerate(zip(tokens.tolist(), logprobs.tolist(), strict=True)):
                if not live[row]:
                    continue
                request = requests[row]
                request.token_ids.append(token)
                request.logprobs.append(logprob)
                counts.generated_tokens += 1
                if token in request.stop_token_ids or len(request.token_ids) >= budget[row]:
                    request.finish()
                    live[row] = False
            if not any(live):
                counts.busy_seconds = time.perf_counter() - start
                return counts
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones((rows, 1))], dim=1)
            output = model(input_ids=tokens.view(rows, 1), attention_mask=attention_mask,
                           position_ids=next_position.expand(3, rows, 1), cache=cache, use_cache=True)
            next_position = next_position + 1
            counts.decode_steps += 1
            counts.forward_rows += rows


def _new_cache(model: Any) -> Any:
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


class ImageQueue:
    """The engine's requests with images: queued by :meth:`generate`, decoded in batches of at most
    ``engine.max_batch_size`` rows by a task of the calling event loop (one at a time, on the engine's
    worker under its lock), answered as each batch ends. ``engine`` is a
    :class:`plasmid_torchgen.engine.TorchEngine`."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: deque[ImageRequest] = deque()
        self._task: asyncio.Task | None = None

    async def generate(self, prompt_ids: list[int], images: vision.VisionInputs,
                       params: SamplingParams) -> GenerationOutput:
        """One response to ``prompt_ids`` with ``images``; errors as :meth:`TorchEngine.generate` (an empty
        prompt, unknown ids, past the context: refused before it is queued; a failed pass: ProviderError)."""
        engine = self.engine
        engine._check_open("generate")
        if not prompt_ids:
            raise ValueError("torchgen: the prompt is empty")
        engine._check_tokens(prompt_ids, "the prompt")
        engine._check_context(len(prompt_ids), params.max_new_tokens)
        loop = engine._bind()
        if loop is not self._loop:             # a new event loop: the old one's requests cannot be answered
            self._loop, self._waiting, self._task = loop, deque(), None
        seed = params.seed if params.seed is not None else int(
            torch.randint(0, 2**62, (), generator=engine.vision_generator))
        request = Request.create(prompt_ids, params, loop.create_future(), engine.place.device)
        request.generator = torch.Generator(device=engine.place.device).manual_seed(seed)
        self._waiting.append(ImageRequest(request, images))
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._serve(), name="torchgen-images")
        output: GenerationOutput = await request.future
        return output

    def take_waiting(self) -> list[Request]:
        """Remove and return the requests not yet in a batch (``abort_all`` answers them)."""
        waiting = [entry.request for entry in self._waiting]
        self._waiting.clear()
        return waiting

    async def _serve(self) -> None:
        """Decode the waiting requests batch after batch until none waits, then stop."""
        engine = self.engine
        loop = asyncio.get_running_loop()
        await asyncio.sleep(0)                       # requests queued in the same tick join the first batch
        try:
            await self._serve_batches(engine, loop)
        finally:  # cancelled (the loop is closing) or a bug: nobody is left waiting forever
            for entry in self.take_waiting():
                if not entry.future.done():
                    entry.future.cancel()

    async def _serve_batches(self, engine: Any, loop: asyncio.AbstractEventLoop) -> None:
        while self._waiting:
            async with engine._lock:
                batch: list[ImageRequest] = []
                while self._waiting and len(batch) < engine.max_batch_size:
                    entry = self._waiting.popleft()
                    if not entry.request.abandoned:
                        batch.append(entry)
                if not batch:
                    continue
                requests = [entry.request for entry in batch]
                try:
                    counts = await loop.run_in_executor(engine._worker, generate_batch, engine.model, requests,
                                                        [entry.images for entry in batch])
                except Exception as error:  # noqa: BLE001 - answered to every caller in the batch
                    engine._fail(requests, error)
                    continue
                engine._stats.add(counts)
                engine._answer(requests)


class VisionSingleTurn(SingleTurn):
    """Generate function ``vision``: :class:`plasmid.builtin.SingleTurn`, except that a sample with
    images (``metadata[VISION_KEY]``) is answered by its engine's ``generate_with_images`` with the
    inputs its ``images`` gives (torchgen, SGLang and vLLM serving a vision-language model have both;
    an engine without them or a text-only model is an error naming it). A resumed partial response is
    continued with the same images."""

    async def __call__(self, ctx: RolloutView, sample: Sample, params: SamplingParams) -> Sample:
        if not vision.has_images(sample):
            return await super().__call__(ctx, sample, params)
        call = self._call(sample, params)
        if call is None:
            return sample
        prefix, budget = call
        engine = ctx.engine_for(sample)
        method = getattr(engine, "generate_with_images", None)
        if method is None:
            raise TypeError(f"--generate vision: the engine {type(engine).__name__} takes no images "
                            f"(torchgen does); choose --engine torchgen for image prompts")
        if engine.images is None:
            raise TypeError(f"--generate vision: sample {sample.index} has images but the engine's model "
                            f"{engine.model_path} is not a vision-language model")
        return self._finish(ctx, sample, prefix, await method(prefix, engine.images(sample), budget))

    async def generate_many(self, ctx: RolloutView, samples: list[Sample],
                            params: list[SamplingParams]) -> list[Sample]:
        """Text samples as :meth:`SingleTurn.generate_many`; samples with images as concurrent calls,
        which the engine decodes together (:class:`ImageQueue`)."""
        with_images = [i for i, sample in enumerate(samples) if vision.has_images(sample)]
        text = [i for i in range(len(samples)) if i not in set(with_images)]
        calls = [self(ctx, samples[i], params[i]) for i in with_images]
        if text:
            calls.append(super().generate_many(ctx, [samples[i] for i in text], [params[i] for i in text]))
        await asyncio.gather(*calls)
        return samples
