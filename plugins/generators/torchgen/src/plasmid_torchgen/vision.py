"""torchgen's path for prompts with images (vision-language models such as Qwen2-VL).

The lean decoder and the continuous batcher take token ids only. A request with images goes through
transformers' ``generate`` instead (:func:`plasmid_torch.vision.generate`: the vision tower's embeddings,
the model's multimodal rotary positions, its KV cache), one request at a time on the engine's compute
thread, under the engine's lock (so no weight update lands mid-request). The weights are the engine's
own: a weight sync or update reaches this path as it reaches the batcher.

The ``vision`` generate function (:class:`VisionSingleTurn`, ``--generate vision``) calls it for a
sample that carries :data:`plasmid_torch.vision.VISION_KEY` in its metadata (a JSON reference to its
images, which the engine's :class:`plasmid_torch.vision.ImageInputs` turns into tensors) and the
ordinary path otherwise, so a text-only run is unchanged whichever generate function it names.
"""

from __future__ import annotations

import asyncio
from typing import Any

from plasmid.builtin import SingleTurn
from plasmid.protocols import RolloutView
from plasmid.types import GenerationOutput, Sample, SamplingParams, Status
from plasmid_torch import vision


async def generate_with_images(engine: Any, prompt_ids: list[int], images: vision.VisionInputs,
                               params: SamplingParams) -> GenerationOutput:
    """One response of ``engine`` (a :class:`plasmid_torchgen.engine.TorchEngine`) to ``prompt_ids``
    with ``images``; errors as :meth:`TorchEngine.generate` (empty prompt, unknown ids, context)."""
    engine._check_open("generate")
    if not prompt_ids:
        raise ValueError("torchgen: the prompt is empty")
    engine._check_tokens(prompt_ids, "the prompt")
    engine._check_context(len(prompt_ids), params.max_new_tokens)
    loop = engine._bind()
    async with engine._lock:
        tokens, logprobs, stopped = await loop.run_in_executor(
            engine._worker, vision.generate, engine.model, prompt_ids, images, params, engine.vision_generator)
    engine._stats.requests += 1
    return GenerationOutput(token_ids=tokens, logprobs=logprobs,
                            status=Status.COMPLETED if stopped else Status.TRUNCATED,
                            weight_version=engine.weight_version)


class VisionSingleTurn(SingleTurn):
    """Generate function ``vision``: :class:`plasmid.builtin.SingleTurn`, except that a sample with
    images (``metadata[VISION_KEY]``) is answered by its engine's ``generate_with_images`` with the
    inputs its ``images`` rebuilds (torchgen serving a vision-language model has both; another
    engine or a text-only model is an error naming it). A resumed partial response is continued with
    the same images."""

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
        """Text samples as :meth:`SingleTurn.generate_many`; samples with images one call each."""
        with_images = [i for i, sample in enumerate(samples) if vision.has_images(sample)]
        text = [i for i in range(len(samples)) if i not in set(with_images)]
        if text:
            await super().generate_many(ctx, [samples[i] for i in text], [params[i] for i in text])
        await asyncio.gather(*(self(ctx, samples[i], params[i]) for i in with_images))
        return samples
