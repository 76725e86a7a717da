"""Images that arrive in chat messages while a run is going: the image parts of a request to the agent
gateway, and the images of a tool's answer in a multi-turn rollout.

Unlike a data source's images (checked at start-up, :mod:`plasmid_torch.vision`), these come from an
agent or a tool, so each one is checked before anything is generated: its source (a data URL; a
``file://`` URL or an absolute local path only where :attr:`ImageLimits.allow_paths` says so; never an
``http(s)`` URL), that it decodes, its size (:attr:`ImageLimits.max_pixels`) and how many there are
(:attr:`ImageLimits.max_images`). A checked image is kept as its PIL image (for the image processor)
and its portable part (:func:`plasmid_torch.vision.portable_part`: what a sample's
``metadata[VISION_KEY]`` reference holds, so the trainer rebuilds the same pixel values from it).

:class:`ChatImages` turns a chat template's rendering into a vision-language model's prompt ids: the
template places one image token per image, and :meth:`ChatImages.expand` repeats each as many times as
its image has tokens (``grid t * h * w / merge_size**2``), as ``Qwen2VLProcessor`` does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plasmid.types import Sample
from plasmid_torch.vision import (
    IMAGE_PART_TYPES,
    MAX_IMAGE_PIXELS,
    VISION_KEY,
    ImageInputs,
    VisionInputs,
    decode_image,
    expand_image_tokens,
    is_vision_config,
    portable_part,
)


@dataclass(frozen=True)
class ImageLimits:
    """What images one request (or one tool answer) may carry.

    :ivar max_images: images at most, all its messages together.
    :ivar max_pixels: pixels (width x height) of one image at most.
    :ivar allow_paths: whether ``file://`` URLs and absolute local paths are read (else data URLs only).
    """

    max_images: int = 8
    max_pixels: int = MAX_IMAGE_PIXELS
    allow_paths: bool = False


@dataclass
class CheckedImage:
    """One image that passed :func:`check_image`: the decoded RGB ``image`` and its portable ``part``."""

    image: Any
    part: dict[str, Any]


def image_source(part: dict[str, Any]) -> Any:
    """Where an image part's image is: ``image_url.url`` (or ``image_url`` itself when a string) of an
    OpenAI part, the ``image``/``path``/``url``/``bytes`` entry of a Hugging Face one; ``None`` if none."""
    if part.get("type") == "image_url":
        url = part.get("image_url")
        return url.get("url") if isinstance(url, dict) else url
    return next((part[key] for key in ("image", "path", "url", "bytes") if part.get(key) is not None), None)


def check_image(part: Any, where: str, limits: ImageLimits) -> CheckedImage:
    """``part`` decoded and checked against ``limits``; a :class:`ValueError` whose one line starts with
    ``where`` (the request field or the tool) when it is not an image part, names no image, names one
    this run does not read (an ``http(s)`` URL; a path or ``file://`` URL without ``allow_paths``; a
    relative path), does not decode, or has more than ``limits.max_pixels`` pixels."""
    if not isinstance(part, dict) or part.get("type") not in IMAGE_PART_TYPES:
        raise ValueError(f"{where}: not an image part ({{'type': 'image_url', 'image_url': {{'url': ...}}}}), "
                         f"got {json.dumps(part, default=str)[:80]}")
    source = image_source(part)
    if isinstance(source, str) and not source.startswith("data:"):
        if "://" in source and not source.startswith("file://"):
            raise ValueError(f"{where}: {source[:80]!r} is not read (no downloads): send the image as a data URL "
                             f"(data:image/png;base64,...)")
        if not limits.allow_paths:
            raise ValueError(f"{where}: {source[:80]!r} is a local file, and local files are not read here: send "
                             f"the image as a data URL (data:image/png;base64,...)")
        if not Path(source.removeprefix("file://")).is_absolute():
            raise ValueError(f"{where}: {source[:80]!r} is a relative path; give an absolute path or a data URL")
    try:
        image = decode_image(part, None, limits.max_pixels)
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None
    return CheckedImage(image, portable_part(part))


def check_count(count: int, where: str, limits: ImageLimits) -> None:
    """A :class:`ValueError` naming ``where`` when ``count`` images are over ``limits.max_images``."""
    if count > limits.max_images:
        raise ValueError(f"{where}: {count} images, over the limit of {limits.max_images}")


class ChatImages:
    """A vision-language model's image processor and image token, for prompts rendered by its chat
    template (see the module docstring). ``ChatImages(model_dir)`` loads them from a model directory
    (:class:`ValueError` naming it when its config has no ``vision_config``)."""

    def __init__(self, model: str | Path) -> None:
        import transformers

        config = transformers.AutoConfig.from_pretrained(str(model))
        if not is_vision_config(config):
            raise ValueError(f"{model} is not a vision-language model (its config has no vision_config)")
        self._setup(ImageInputs(str(model)), int(config.image_token_id))

    @classmethod
    def of(cls, images: ImageInputs, image_token_id: int) -> ChatImages:
        """The helper of an image processor already loaded (``images``) and the model's image token."""
        made = cls.__new__(cls)
        made._setup(images, image_token_id)
        return made

    def _setup(self, images: ImageInputs, image_token_id: int) -> None:
        #: the image processor (also rebuilds a sample's inputs from its reference)
        self.images = images
        self.image_token_id = image_token_id

    def inputs(self, images: list[Any]) -> VisionInputs:
        """The model inputs of PIL ``images`` (at least one), in order."""
        return self.images.process(images)

    def counts(self, inputs: VisionInputs) -> list[int]:
        """How many image tokens each image of ``inputs`` takes in the prompt."""
        return self.images.token_counts(inputs)

    def expand(self, ids: list[int], counts: list[int]) -> list[int]:
        """``ids`` with its ``k``-th image token repeated ``counts[k]`` times
        (:func:`plasmid_torch.vision.expand_image_tokens`); a :class:`ValueError` when ``ids`` holds
        another number of image tokens than ``counts`` has entries."""
        return expand_image_tokens(ids, self.image_token_id, counts)


def engine_images(engine: Any, parts: list[dict[str, Any]]) -> Any:
    """What ``engine.generate_with_images`` takes for the portable image ``parts``: the answer of the
    engine's ``images`` to a sample that references them (:class:`~plasmid_torch.vision.VisionInputs`
    for torchgen, data URLs for the HTTP engines). A :class:`ValueError` (one line, naming the engine's
    class) when the engine takes no images (no ``generate_with_images``, or no ``images`` because its
    model is text-only); the engine's own error when it cannot read them."""
    if getattr(engine, "generate_with_images", None) is None or getattr(engine, "images", None) is None:
        raise ValueError(f"the rollout engine {type(engine).__name__} takes no images (torchgen, sglang and vllm "
                         f"serving a vision-language model do)")
    return engine.images(Sample(prompt="", metadata={VISION_KEY: {"images": [dict(part) for part in parts]}}))
