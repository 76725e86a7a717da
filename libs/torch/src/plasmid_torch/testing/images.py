"""Prompts with images for the multimodal contract checks (test support; needs Pillow).

The images are single-colour PNGs as data URLs, so that two prompts differ only in their image; the
samples carry them as :mod:`plasmid_torch.vision` says (``metadata[VISION_KEY]``, the image tokens
expanded in ``tokens``), as the jsonl, hf and tasks data sources make them.
"""

from __future__ import annotations

import base64
import dataclasses
import io
from pathlib import Path
from typing import Any

from plasmid.types import Sample, SamplingParams
from plasmid_torch import vision
from plasmid_torch.tiny import EOS_ID

#: Two colours far apart: the prompts of :func:`image_samples` alternate between them.
RED, BLUE = (255, 0, 0), (0, 0, 255)


def data_url(colour: tuple[int, int, int], size: tuple[int, int] = (32, 32)) -> str:
    """A PNG of one ``colour`` (RGB) and ``size`` (width, height) pixels as a data URL."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def image_messages(colour: tuple[int, int, int], question: str = "which colour?") -> list[dict[str, Any]]:
    """One user message: an OpenAI ``image_url`` part of ``colour``, then ``question``."""
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(colour)}},
                                         {"type": "text", "text": question}]}]


def image_samples(model_dir: str | Path, colours: list[tuple[int, int, int]], per_prompt: int = 1) -> list[Sample]:
    """``per_prompt`` fresh samples (one group) of a prompt with an image of each of ``colours``, encoded
    for the vision-language model in ``model_dir`` (:class:`plasmid_torch.vision.VisionEncoder`)."""
    encoder = vision.VisionEncoder(str(model_dir))
    samples = []
    for group, colour in enumerate(colours):
        messages = image_messages(colour)
        ids, reference = encoder.encode(messages, f"image prompt {group}")
        samples += [Sample(prompt=messages, tokens=list(ids), metadata={vision.VISION_KEY: reference},
                           index=group * per_prompt + k, group_index=group) for k in range(per_prompt)]
    return samples


def with_image_of(sample: Sample, other: Sample) -> Sample:
    """A copy of ``sample`` (tokens, response, log-probs, reward...) whose images are ``other``'s (images of
    one size: the image tokens in ``tokens`` must fit them)."""
    return dataclasses.replace(sample, prompt=other.prompt, tokens=list(sample.tokens),
                               metadata={**sample.metadata, vision.VISION_KEY: other.metadata[vision.VISION_KEY]})


def respond(model: Any, images: vision.ImageInputs, sample: Sample, max_new_tokens: int = 6, seed: int = 0) -> Sample:
    """``sample`` answered by the vision-language ``model`` (its image inputs from ``images``) through
    :func:`plasmid_torch.vision.generate`, the sampling path of the torch engines for images, at
    temperature 1 with ``seed``: the response appended to ``tokens``, and ``response_length``,
    ``loss_mask`` and ``rollout_logprobs`` (what the engine reported) set. Returns ``sample``."""
    params = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, stop_token_ids=(EOS_ID,), seed=seed)
    tokens, logprobs, _ = vision.generate(model, list(sample.tokens), images(sample), params)
    sample.tokens = list(sample.tokens) + tokens
    sample.response_length = len(tokens)
    sample.loss_mask = [1] * len(tokens)
    sample.rollout_logprobs = logprobs
    return sample
