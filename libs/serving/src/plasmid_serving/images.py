"""Images of a sample as an inference server takes them, for the engines over HTTP (SGLang, vLLM).

A sample with images carries a JSON reference under ``Sample.metadata[VISION_KEY]``:
``{"images": [{"type": "image", "image": S}, ...]}`` with ``S`` a data URL or an absolute path
(:mod:`plasmid_torch.vision` writes it; this module reads it without torch). Its prompt ids hold each
image's tokens already expanded (one image token repeated ``grid t * h * w / merge**2`` times, as the
model's processor and plasmid's trainer build them). SGLang (``image_data``) and vLLM
(``multi_modal_data``) want the images themselves and a prompt in which each image is *one* image
token, which their own processor expands; :func:`collapse_image_tokens` makes that prompt, and the
engines check that the server's expansion has the length plasmid's has.

:class:`ServedImages` is what an engine's ``images`` attribute holds: called with a sample, the
images as data URLs, or one error naming the engine when its model takes no images.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from plasmid.errors import UsageError
from plasmid_serving.names import EngineNames

#: ``Sample.metadata`` key of a sample's image reference; the same string as
#: ``plasmid_torch.vision.VISION_KEY`` (kept here so that reading it needs no torch; a test checks both).
VISION_KEY = "plasmid_torch.vision"
#: Media types of image files by suffix (anything else is sent as ``image/png``: servers sniff the bytes).
_MEDIA = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif",
          ".webp": "image/webp", ".bmp": "image/bmp"}


def data_url(part: Any) -> str:
    """The data URL of one reference part ``{"type": "image", "image": S}``: ``S`` itself when it is a
    data URL, else the bytes of the file at the absolute path ``S``, base64-encoded.

    :raises ValueError: the part has no ``image`` string, or the file cannot be read (one line).
    """
    source = part.get("image") if isinstance(part, dict) else None
    if not isinstance(source, str) or not source:
        raise ValueError(f"an image reference part must be {{'type': 'image', 'image': data URL or path}}, "
                         f"got {str(part)[:80]}")
    if source.startswith("data:"):
        return source
    path = Path(source)
    try:
        payload = path.read_bytes()
    except OSError as error:
        raise ValueError(f"cannot read image {path}: {error.strerror or error}") from None
    media = _MEDIA.get(path.suffix.lower(), "image/png")
    return f"data:{media};base64,{base64.b64encode(payload).decode('ascii')}"


def model_config(model_path: str) -> dict[str, Any]:
    """The ``config.json`` of model directory ``model_path``; ``{}`` when it cannot be read."""
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def vocab_size_of(config: dict[str, Any]) -> int:
    """The vocabulary size of a model ``config`` (a ``config.json`` read): its ``vocab_size``, or a
    vision-language model's ``text_config.vocab_size``; 0 when neither is there."""
    text = config.get("text_config")
    value = config.get("vocab_size") or (text.get("vocab_size") if isinstance(text, dict) else None)
    return int(value or 0)


def takes_images(model_path: str) -> bool:
    """Whether the model in ``model_path`` takes images (its ``config.json`` has a ``vision_config``)."""
    return isinstance(model_config(model_path).get("vision_config"), dict)


def collapse_image_tokens(prompt_ids: list[int], image_token_id: int, images: int) -> list[int]:
    """``prompt_ids`` with every run of ``image_token_id`` made one token: the prompt as a chat template
    renders it, before a processor expands each image's token.

    :raises ValueError: the number of runs is not ``images`` (the prompt and its images disagree).
    """
    collapsed: list[int] = []
    runs = 0
    for position, token in enumerate(prompt_ids):
        if token == image_token_id:
            if position and prompt_ids[position - 1] == image_token_id:
                continue
            runs += 1
        collapsed.append(token)
    if runs != images:
        raise ValueError(f"the prompt has {runs} runs of image token {image_token_id} for {images} images")
    return collapsed


class ServedImages:
    """What an HTTP engine serving model directory ``model_path`` does with samples' images.

    The model's ``config.json`` is read when first needed: a ``vision_config`` makes it a
    vision-language model whose image token is its ``image_token_id``.
    """

    def __init__(self, model_path: str, names: EngineNames) -> None:
        self.model_path = model_path
        self.names = names
        self._config: dict[str, Any] | None = None

    @property
    def config(self) -> dict[str, Any]:
        """The model's ``config.json`` (:func:`model_config`), read once."""
        if self._config is None:
            self._config = model_config(self.model_path)
        return self._config

    @property
    def vision(self) -> bool:
        """Whether the served model takes images (its config has a ``vision_config``)."""
        return isinstance(self.config.get("vision_config"), dict)

    @property
    def image_token_id(self) -> int:
        """The model's image token (its config's ``image_token_id``); :class:`UsageError` when it has none."""
        value = self.config.get("image_token_id")
        if not isinstance(value, int):
            raise self.refusal("its config.json has no image_token_id")
        return value

    def __call__(self, sample: Any) -> list[str]:
        """``sample``'s images as data URLs, in prompt order.

        :raises UsageError: the engine's model is text-only, or the sample's reference is not
            ``{"images": [part, ...]}`` or names an image that cannot be read; one line naming the
            engine, its plugin and the sample.
        """
        if not self.vision:
            raise self.refusal(f"sample {getattr(sample, 'index', '?')} has images, but the model is text-only "
                                f"(its config.json has no vision_config); serve a vision-language model")
        reference = getattr(sample, "metadata", {}).get(VISION_KEY)
        parts = reference.get("images") if isinstance(reference, dict) else None
        if not isinstance(parts, list) or not parts:
            raise self.refusal(f"sample {getattr(sample, 'index', '?')}: metadata[{VISION_KEY!r}] must be "
                                f"{{'images': [image part, ...]}}, got {str(reference)[:80]}")
        try:
            return [data_url(part) for part in parts]
        except ValueError as error:
            raise self.refusal(f"sample {getattr(sample, 'index', '?')}: {error}") from None

    def server_prompt(self, prompt_ids: list[int], images: list[str]) -> list[int]:
        """The ids to send with ``images``: :func:`collapse_image_tokens` with the model's image token;
        a mismatch is a :class:`UsageError` naming the engine."""
        try:
            return collapse_image_tokens(prompt_ids, self.image_token_id, len(images))
        except ValueError as error:
            raise self.refusal(str(error)) from None

    def check_expansion(self, server: str, expanded: list[int] | int, prompt_ids: list[int]) -> None:
        """Fail when ``server`` expanded the images into other prompt ids than plasmid's (the trainer's)
        ``prompt_ids``: ``expanded`` is the server's prompt ids, or only their number where the server
        reports no more. Log-probs of a response to another prompt would not line up with the trainer's."""
        same = expanded == prompt_ids if isinstance(expanded, list) else expanded == len(prompt_ids)
        if not same:
            size = len(expanded) if isinstance(expanded, list) else expanded
            raise self.names.error(f"{self.names.provider} generate: {server} expanded the prompt with its images "
                                   f"into other ids ({size} tokens) than plasmid's ({len(prompt_ids)} tokens): its "
                                   f"image processor differs from {self.model_path}'s preprocessor_config.json")

    def refusal(self, message: str) -> UsageError:
        """A :class:`UsageError` of ``message`` that names the engine, its plugin and its model."""
        return UsageError(f"engine '{self.names.provider}' (plugin {self.names.plugin}, model {self.model_path}): "
                          f"{message}")
