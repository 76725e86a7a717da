"""Images in prompts: decoding and checking image parts of chat messages, the model inputs they
become (Qwen2-VL style: ``pixel_values``, ``image_grid_thw``, the image tokens expanded in the ids),
and log-probs and sampling with those inputs.

A sample's images travel as chat messages in ``Sample.prompt`` (what the data source read) and as a
JSON reference under ``Sample.metadata[VISION_KEY]``: ``{"images": [part, ...]}``, each part an
``{"type": "image", "image": S}`` whose ``S`` is a data URL or an absolute path (:func:`portable_part`).
Metadata stays JSON, so a sample with images goes into a checkpoint (given-back groups, the async
rollout in flight) like any other. The engine and the trainer rebuild the tensors from that reference
with the model's image processor (:class:`ImageInputs`, cached), so both compute with the same pixel
values. Image parts accepted:

- OpenAI: ``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}`` (a data URL, a
  ``file://`` URL or a local path);
- Hugging Face: ``{"type": "image", "image": X}``, ``{"type": "image", "path": P}``, ``{"type": "image",
  "url": U}`` or ``{"type": "image", "bytes": B}``, where ``X`` is a path, a data URL, bytes or a PIL image.

Relative paths resolve against the data file's directory. Needs Pillow (``pip install pillow``).
"""

from __future__ import annotations

import base64
import io
import json
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from plasmid.errors import UsageError
from plasmid.records import MISSING, lookup

#: ``Sample.metadata`` key of a sample's :class:`VisionInputs` (owned by this module).
VISION_KEY = "plasmid_torch.vision"
#: Largest image accepted, in pixels (width x height), unless the caller gives another bound.
MAX_IMAGE_PIXELS = 4096 * 4096
IMAGE_PART_TYPES = ("image", "image_url")


@dataclass
class VisionInputs:
    """The model inputs of one prompt's images, in the prompt's order.

    :ivar pixel_values: ``[patches, channels * temporal * patch * patch]`` float32, the image
        processor's output for all the prompt's images.
    :ivar image_grid_thw: ``[images, 3]`` int64, each image's (frames, height, width) in patches.
    """

    pixel_values: torch.Tensor
    image_grid_thw: torch.Tensor


def is_vision_config(config: Any) -> bool:
    """Whether a Hugging Face model config has a vision tower (a ``vision_config``)."""
    return getattr(config, "vision_config", None) is not None


def image_parts(messages: Any) -> list[dict[str, Any]]:
    """The image parts of chat ``messages`` in order (none for a string prompt or string contents)."""
    if not isinstance(messages, list):
        return []
    return [part for message in messages if isinstance(message, dict) and isinstance(message.get("content"), list)
            for part in message["content"] if isinstance(part, dict) and part.get("type") in IMAGE_PART_TYPES]


def decode_image(part: dict[str, Any], base_dir: Path | None = None, max_pixels: int = MAX_IMAGE_PIXELS) -> Any:
    """The RGB PIL image of an image ``part``; :class:`ValueError` (one line, no location) when it has
    no source, cannot be read or decoded, or has more than ``max_pixels`` pixels."""
    from PIL import Image

    source: Any
    if part.get("type") == "image_url":
        url = part.get("image_url")
        source = url.get("url") if isinstance(url, dict) else url
    else:
        source = next((part[key] for key in ("image", "path", "url", "bytes") if part.get(key) is not None), None)
    if source is None:
        raise ValueError(f"image part {_short(part)} has no image (expected image_url.url, image, path or bytes)")
    if isinstance(source, Image.Image):
        image = source
    else:
        data = _image_bytes(source, base_dir)
        try:
            image = Image.open(io.BytesIO(data))
            _check_size(image, max_pixels)      # from the header, before the pixels are decoded
            image.load()
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as error:
            if isinstance(error, _TooLarge):
                raise
            raise ValueError(f"cannot decode the image ({type(error).__name__}: {error})") from None
    _check_size(image, max_pixels)
    return image.convert("RGB")


class _TooLarge(ValueError):
    pass


def _check_size(image: Any, max_pixels: int) -> None:
    if image.width * image.height > max_pixels:
        raise _TooLarge(f"image of {image.width}x{image.height} pixels is over the limit of {max_pixels} pixels")


def _image_bytes(source: Any, base_dir: Path | None) -> bytes:
    if isinstance(source, (bytes, bytearray)):
        return bytes(source)
    if not isinstance(source, str) or not source:
        raise ValueError(f"an image source must be a path, a data URL or bytes, got {_short(source)}")
    if source.startswith("data:"):
        header, _, payload = source.partition(",")
        if ";base64" not in header:
            raise ValueError(f"data URL {source[:40]!r} is not base64")
        try:
            return base64.b64decode(payload, validate=True)
        except ValueError as error:
            raise ValueError(f"data URL {source[:40]!r}...: bad base64 ({error})") from None
    if "://" in source and not source.startswith("file://"):
        raise ValueError(f"image URL {source!r}: only data: and file:// URLs and local paths are read (no downloads)")
    path = Path(source.removeprefix("file://"))
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    try:
        return path.read_bytes()
    except OSError as error:
        raise ValueError(f"cannot read image {path}: {error.strerror or error}") from None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def load_images(messages: Any, location: str, base_dir: Path | None = None,
                max_pixels: int = MAX_IMAGE_PIXELS) -> list[Any]:
    """Every image of ``messages`` decoded (:func:`decode_image`); a failure is one
    :class:`UsageError` naming ``location`` (file and row) and the image's place among them."""
    images = []
    for number, part in enumerate(image_parts(messages), 1):
        try:
            images.append(decode_image(part, base_dir, max_pixels))
        except ValueError as error:
            raise UsageError(f"{location}: image {number}: {error}") from None
    return images


def text_only(messages: Any) -> Any:
    """``messages`` with each image part replaced by ``{"type": "image"}`` (the chat template needs
    only the place of an image; the pixels are in :class:`VisionInputs`)."""
    if not isinstance(messages, list):
        return messages
    return [{**message, "content": [{"type": "image"} if isinstance(part, dict) and part.get("type")
                                    in IMAGE_PART_TYPES else part for part in message["content"]]}
            if isinstance(message.get("content"), list) else message for message in messages]


def portable_part(part: dict[str, Any], base_dir: Path | None = None) -> dict[str, Any]:
    """Image ``part`` as JSON that names the same image anywhere in this run: ``{"type": "image",
    "image": S}`` with ``S`` a data URL (bytes and PIL images are PNG-encoded) or an absolute path
    (relative paths resolved against ``base_dir``, ``file://`` dropped)."""
    from PIL import Image

    if part.get("type") == "image_url":
        url = part.get("image_url")
        source = url.get("url") if isinstance(url, dict) else url
    else:
        source = next((part[key] for key in ("image", "path", "url", "bytes") if part.get(key) is not None), None)
    if isinstance(source, Image.Image):
        buffer = io.BytesIO()
        source.save(buffer, "PNG")
        source = buffer.getvalue()
    if isinstance(source, (bytes, bytearray)):
        return {"type": "image", "image": "data:image;base64," + base64.b64encode(bytes(source)).decode("ascii")}
    if not isinstance(source, str) or source.startswith("data:"):
        return {"type": "image", "image": source}
    path = Path(source.removeprefix("file://"))
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    return {"type": "image", "image": str(path.resolve())}


def has_images(sample: Any) -> bool:
    """Whether ``sample`` carries images (a :data:`VISION_KEY` reference in its metadata)."""
    return VISION_KEY in sample.metadata


class ImageInputs:
    """The :class:`VisionInputs` of samples, rebuilt from their ``metadata[VISION_KEY]`` reference with
    the image processor of model directory ``model`` (``AutoImageProcessor``). The last ``cache_size``
    references are kept (a prompt's samples and a step's passes share them). ``image_processor``, when
    given, is used instead of loading one from ``model``."""

    def __init__(self, model: str | None = None, cache_size: int = 4096, *, image_processor: Any = None) -> None:
        if image_processor is None:
            import transformers

            image_processor = transformers.AutoImageProcessor.from_pretrained(str(model))
        self.image_processor = image_processor
        self.merge = int(getattr(self.image_processor, "merge_size", 1))
        self._cache: OrderedDict[str, VisionInputs] = OrderedDict()
        self._cache_size = cache_size

    def token_counts(self, inputs: VisionInputs) -> list[int]:
        """How many image tokens each image of ``inputs`` takes in a prompt (``grid t * h * w / merge_size**2``)."""
        return [int(count) for count in (inputs.image_grid_thw.prod(dim=1) // self.merge ** 2).tolist()]

    def process(self, images: list[Any]) -> VisionInputs:
        """The image processor's tensors of PIL ``images`` (at least one)."""
        processed = self.image_processor(images=images, return_tensors="pt")
        return VisionInputs(processed["pixel_values"].to(torch.float32), processed["image_grid_thw"].to(torch.long))

    def __call__(self, sample: Any) -> VisionInputs | None:
        """``sample``'s vision inputs, or ``None`` without images; :class:`UsageError` naming the sample
        when its reference is not ``{"images": [part, ...]}`` or an image no longer decodes."""
        reference = sample.metadata.get(VISION_KEY)
        if reference is None:
            return None
        if not isinstance(reference, dict) or not isinstance(reference.get("images"), list) \
                or not reference["images"]:
            raise UsageError(f"sample {sample.index}: metadata[{VISION_KEY!r}] must be {{'images': [image part, ...]}} "
                             f"(plasmid_torch.vision.VisionEncoder.encode writes it), got {_short(reference)}")
        key = json.dumps(reference, sort_keys=True)
        inputs = self._cache.get(key)
        if inputs is None:
            messages = [{"role": "user", "content": reference["images"]}]
            inputs = self.process(load_images(messages, f"sample {sample.index}"))
            self._cache[key] = inputs
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return inputs


def expand_image_tokens(ids: list[int], image_token_id: int, counts: list[int]) -> list[int]:
    """``ids`` with its ``k``-th ``image_token_id`` repeated ``counts[k]`` times (a chat template places
    one per image); a :class:`ValueError` when ``ids`` holds another number of them than ``counts`` has."""
    places = [i for i, token in enumerate(ids) if token == image_token_id]
    if len(places) != len(counts):
        raise ValueError(f"the chat template placed {len(places)} image tokens for {len(counts)} images")
    expanded = list(ids)
    for place, count in zip(reversed(places), reversed(counts), strict=True):
        expanded[place:place + 1] = [image_token_id] * count
    return expanded


class VisionEncoder:
    """Encodes chat prompts with images for the VLM in model directory ``model``: its tokenizer's
    chat template, its image processor (``images``, an :class:`ImageInputs`), and the image token expanded to each
    image's token count (``grid t * h * w / merge_size**2``), as ``Qwen2VLProcessor`` does."""

    def __init__(self, model: str) -> None:
        import transformers

        from plasmid_torch.hf import load_tokenizer

        config = transformers.AutoConfig.from_pretrained(str(model))
        if not is_vision_config(config):
            raise UsageError(f"--model {model}: not a vision-language model (its config has no vision_config)")
        self._setup(load_tokenizer(str(model)), ImageInputs(model), config.image_token_id)

    @classmethod
    def of(cls, tokenizer: Any, image_processor: Any, image_token_id: int) -> VisionEncoder:
        """The encoder of a model not saved yet: its ``tokenizer``, ``image_processor`` and image token."""
        encoder = cls.__new__(cls)
        encoder._setup(tokenizer, ImageInputs(image_processor=image_processor), image_token_id)
        return encoder

    def _setup(self, tokenizer: Any, images: ImageInputs, image_token_id: int) -> None:
        self.tokenizer = tokenizer
        self.images = images
        self.image_token_id = image_token_id

    def __call__(self, messages: list[dict[str, Any]], images: list[Any]) -> tuple[list[int], VisionInputs | None]:
        """``(prompt ids, vision inputs or None without images)``; :class:`ValueError` when the
        rendered prompt's image tokens do not match the number of images."""
        text = self.tokenizer.apply_chat_template(text_only(messages), add_generation_prompt=True, tokenize=False)
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        if not images:
            return expand_image_tokens(ids, self.image_token_id, []), None
        inputs = self.images.process(images)
        return expand_image_tokens(ids, self.image_token_id, self.images.token_counts(inputs)), inputs

    def encode(self, messages: list[dict[str, Any]], location: str, base_dir: Path | None = None,
               max_pixels: int = MAX_IMAGE_PIXELS) -> tuple[list[int], dict[str, Any] | None]:
        """``(prompt ids, metadata reference or None without images)`` of chat ``messages``: every image
        decoded and checked (:func:`load_images`; a failure is one :class:`UsageError` naming
        ``location``), the reference ``{"images": [portable_part, ...]}`` to store under
        ``Sample.metadata[VISION_KEY]``."""
        images = load_images(messages, location, base_dir, max_pixels)
        try:
            ids, _ = self(messages, images)
        except ValueError as error:
            raise UsageError(f"{location}: {error}") from None
        if not images:
            return ids, None
        return ids, {"images": [portable_part(part, base_dir) for part in image_parts(messages)]}


def forward_inputs(model: Any, input_ids: torch.Tensor, inputs: list[VisionInputs | None]) -> dict[str, torch.Tensor]:
    """The image keyword arguments of ``model``'s forward pass over ``input_ids`` (``[B, L]``) whose rows
    have the vision inputs ``inputs`` (in row order; ``None`` for a row without images): ``pixel_values``,
    ``image_grid_thw`` and ``mm_token_type_ids`` (1 at the image tokens, which the model needs to compute
    its multimodal rotary positions), on ``input_ids``' device; ``{}`` when no row has images."""
    present = [entry for entry in inputs if entry is not None]
    if not present:
        return {}
    device = input_ids.device
    image_token_id = model.config.image_token_id
    return {"pixel_values": torch.cat([entry.pixel_values for entry in present]).to(device),
            "image_grid_thw": torch.cat([entry.image_grid_thw for entry in present]).to(device),
            "mm_token_type_ids": (input_ids == image_token_id).to(torch.int32)}


def vision_tower(model: Any) -> torch.nn.Module:
    """The vision tower of a Hugging Face VLM (``model.visual`` or ``model.model.visual`` in Qwen2-VL and
    its kind, which holds the patch encoder and the merger into the text model); :class:`ValueError`
    naming the model's class when it has none of these."""
    for owner in (model, getattr(model, "model", None)):
        for name in ("visual", "vision_tower", "vision_model"):
            tower = getattr(owner, name, None) if owner is not None else None
            if isinstance(tower, torch.nn.Module):
                return tower
    raise ValueError(f"{type(model).__name__} has no vision tower (visual, vision_tower or vision_model)")


def vision_token_ids(config: Any) -> list[int]:
    """The ids of a VLM config's vision special tokens (image, video, vision start and end) that it names."""
    names = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
    return [value for value in (getattr(config, name, None) for name in names) if isinstance(value, int)]


def generate(model: Any, prompt_ids: list[int], vision: VisionInputs | None, params: Any,
             generator: torch.Generator | None = None) -> tuple[list[int], list[float], bool]:
    """Sample one response of the vision-language ``model`` to ``prompt_ids`` with the images
    ``vision``, through transformers' ``generate`` (its KV cache and multimodal rotary positions).

    Sampling follows ``params`` (a :class:`plasmid.types.SamplingParams`): greedy at temperature 0,
    else ``do_sample`` at ``temperature`` with transformers' ``top_k`` then ``top_p`` warpers (applied
    one after the other, which can keep fewer tokens than SGLang's joint rule), never a vision special
    token (:func:`vision_token_ids`: an image token in a response would not match any image); ``params.seed`` or
    ``generator`` seeds it (the global torch RNG is forked, so other draws are unaffected). The
    response ends at the first of ``params.stop_token_ids`` (kept) or after ``max_new_tokens``.

    :returns: ``(token ids, log-probs, stopped)``: each token's log-probability under the model's
        logits at ``temperature`` (temperature 1 when greedy), before top-k/top-p, float32 natural log,
        as the engines report them; ``stopped`` when a stop token ended it.
    """
    device = next(model.parameters()).device
    stop = list(params.stop_token_ids)
    settings: dict[str, Any] = dict(max_new_tokens=params.max_new_tokens, do_sample=params.temperature > 0,
                                    return_dict_in_generate=True, output_logits=True,
                                    eos_token_id=stop or None, pad_token_id=model.config.get_text_config().pad_token_id,
                                    suppress_tokens=vision_token_ids(model.config) or None)
    if params.temperature > 0:
        settings.update(temperature=params.temperature, top_k=params.top_k if params.top_k > 0 else None,
                        top_p=params.top_p)
    ids = torch.tensor([prompt_ids], device=device)
    seed = params.seed if params.seed is not None else (
        int(torch.randint(0, 2**62, (), generator=generator)) if generator is not None else None)
    with torch.random.fork_rng(devices=[] if device.type == "cpu" else [device]), torch.no_grad():
        if seed is not None:
            torch.manual_seed(seed)
        output = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                **forward_inputs(model, ids, [vision]), **settings)
    tokens = output.sequences[0, len(prompt_ids):].tolist()
    temperature = params.temperature if params.temperature > 0 else 1.0
    logits = torch.stack(output.logits[:len(tokens)], dim=1)[0].float()                  # [T, vocab]
    chosen = torch.tensor(tokens, device=logits.device)
    logprobs = torch.log_softmax(logits / temperature, dim=-1).gather(1, chosen.unsqueeze(1)).squeeze(1)
    end = next((i + 1 for i, token in enumerate(tokens) if token in stop), len(tokens))
    return tokens[:end], logprobs[:end].tolist(), end <= len(tokens) and bool(tokens) and tokens[end - 1] in stop


def portable_prompt(messages: Any, base_dir: Path | None = None) -> Any:
    """``messages`` with each image part replaced by its :func:`portable_part` (the same image
    wherever the prompt is read again: no relative path, no bytes)."""
    if not image_parts(messages):
        return messages
    return [{**message, "content": [portable_part(part, base_dir) if isinstance(part, dict) and part.get("type")
                                    in IMAGE_PART_TYPES else part for part in message["content"]]}
            if isinstance(message, dict) and isinstance(message.get("content"), list) else message
            for message in messages]


class ImagePromptEncoder:
    """Token ids of a data source's prompts, some of which may have images: ``text`` (a
    :class:`plasmid_torch.prompts.PromptEncoder` of ``model``) encodes prompts without images; a prompt
    with images goes through a :class:`VisionEncoder` of ``model`` (built when first needed, so a
    text-only run never loads an image processor; a text-only ``model`` is then a :class:`UsageError`).
    """

    def __init__(self, text: Any, model: str, max_pixels: int = MAX_IMAGE_PIXELS) -> None:
        self.text = text
        self.model = model
        #: the largest image :meth:`prepare` accepts, in pixels (width x height)
        self.max_pixels = max_pixels
        self._vision: VisionEncoder | None = None

    @property
    def chat_template_flag(self) -> str:
        return str(self.text.chat_template_flag)

    def check(self, prompt: Any, location: str) -> Any:
        """The prompt as stored on samples: the text encoder's check, or for messages with images or
        typed parts (a parquet file's text-only rows have parts too when other rows have images),
        ``{"role", "content"}`` messages whose content is a string or a list of typed parts (chat
        mode needed); errors name ``location``."""
        has_parts = isinstance(prompt, list) and prompt and any(
            isinstance(message, dict) and isinstance(message.get("content"), list) for message in prompt)
        if not has_parts:
            return self.text.check(prompt, location)
        if not self.text.chat:
            what = "with images" if image_parts(prompt) else "with typed content parts"
            raise UsageError(f"{location}: the prompt is chat messages {what}; add {self.text.flag}")
        for message in prompt:
            content = message.get("content") if isinstance(message, dict) else None
            if not isinstance(message, dict) or not isinstance(message.get("role"), str) or not (
                    isinstance(content, str) or isinstance(content, list)
                    and all(isinstance(part, dict) and isinstance(part.get("type"), str) for part in content)):
                raise UsageError(f"{location}: a message must be {{'role': str, 'content': str or a list of "
                                 f"{{'type': ...}} parts}}, got {_short(message)}")
        return [{"role": message["role"], "content": message["content"]} for message in prompt]

    def prepare(self, prompt: Any, metadata: dict[str, Any], location: str,
                base_dir: Path | None = None) -> tuple[Any, dict[str, Any]]:
        """``(prompt, metadata)`` of a row read from a file in ``base_dir``: a prompt with images has
        every image decoded and checked (at most :attr:`max_pixels` pixels; a failure is one
        :class:`UsageError` naming ``location`` and the image), its image parts made portable
        (:func:`portable_prompt`) and the reference added to ``metadata`` under :data:`VISION_KEY`; other
        prompts come back as they are."""
        if not image_parts(prompt):
            return prompt, metadata
        _, reference = self.vision.encode(prompt, location, base_dir, self.max_pixels)
        return portable_prompt(prompt, base_dir), {**metadata, VISION_KEY: reference}

    @property
    def vision(self) -> VisionEncoder:
        if self._vision is None:
            self._vision = VisionEncoder(self.model)
        return self._vision

    def __call__(self, prompt: Any) -> list[int]:
        """The prompt's ids; with images, the image tokens expanded (its images as :meth:`prepare` left them)."""
        if not image_parts(prompt):
            return list(self.text(prompt))
        return self.vision.encode(prompt, "a prompt with images")[0]


def column_part(value: Any) -> dict[str, Any]:
    """The image part of one value of an image column: a PIL image, encoded bytes, a path or data URL
    string, or the ``{"bytes", "path"}`` dict that Hugging Face ``datasets`` stores for its ``Image``
    feature (bytes win when both are set); :class:`ValueError` (one line, no location) for anything else."""
    from PIL import Image

    if isinstance(value, Image.Image) or (isinstance(value, str) and value):
        return {"type": "image", "image": value}
    if isinstance(value, (bytes, bytearray)):
        return {"type": "image", "bytes": bytes(value)}
    if isinstance(value, dict) and (value.get("bytes") is not None or value.get("path")):
        if value.get("bytes") is not None:
            return {"type": "image", "bytes": bytes(value["bytes"])}
        return {"type": "image", "path": value["path"]}
    raise ValueError(f"an image must be a PIL image, bytes, a path, a data URL or {{'bytes', 'path'}}, "
                     f"got {_short(value)}")


def is_placeholder(part: Any) -> bool:
    """Whether ``part`` is an image part that names no image (``{"type": "image"}``, as Hugging Face chat
    datasets mark where each image of their image column goes)."""
    return isinstance(part, dict) and part.get("type") == "image" and all(
        part.get(key) is None for key in ("image", "path", "url", "bytes"))


def collect_column(rows: Iterable[tuple[str, Any]], key: str, into: list[Any]) -> Iterator[tuple[str, Any]]:
    """``(location, row)`` of ``rows`` as they are, appending each row's ``key`` value (dotted for nested
    objects, :func:`plasmid.records.lookup`; ``None`` where a row has none) to ``into``: a data source
    reads its image column beside the records that :func:`plasmid.records.records_of` makes of the rows."""
    for location, row in rows:
        value = lookup(row, key) if isinstance(row, dict) else MISSING
        into.append(None if value is MISSING else value)
        yield location, row


def with_column_images(prompt: Any, values: Any, location: str) -> Any:
    """``prompt`` (a string or chat messages) with the images of an image column's ``values`` (one value
    or a list; ``None`` or an empty list: no images, ``prompt`` as it is) as image parts (:func:`column_part`).

    Where the messages hold as many placeholders (:func:`is_placeholder`) as there are images, each
    placeholder gets its image, in order; without placeholders the images go first in the first user
    message's content (a string content becomes a text part after them); a string prompt becomes one user
    message of the images then the text. Other counts of placeholders, messages without a user message
    and bad values are one :class:`UsageError` naming ``location``.
    """
    values = [] if values is None else values if isinstance(values, list) else [values]
    if not values:
        return prompt
    try:
        parts = [column_part(value) for value in values]
    except ValueError as error:
        raise UsageError(f"{location}: {error}") from None
    if isinstance(prompt, str):
        return [{"role": "user", "content": [*parts, {"type": "text", "text": prompt}]}]
    if not isinstance(prompt, list) or not all(isinstance(message, dict) for message in prompt):
        raise UsageError(f"{location}: images need a string prompt or chat messages, got {_short(prompt)}")
    places = [(m, p) for m, message in enumerate(prompt) if isinstance(message.get("content"), list)
              for p, part in enumerate(message["content"]) if is_placeholder(part)]
    messages = [dict(message) for message in prompt]
    if places:
        if len(places) != len(parts):
            raise UsageError(f"{location}: the messages have {len(places)} image placeholders for "
                             f"{len(parts)} images in the image column")
        for (m, p), part in zip(places, parts, strict=True):
            messages[m]["content"] = list(messages[m]["content"])
            messages[m]["content"][p] = part
        return messages
    first_user = next((m for m, message in enumerate(messages) if message.get("role") == "user"), None)
    if first_user is None:
        raise UsageError(f"{location}: the messages have no user message to put the column's images in")
    content = messages[first_user].get("content")
    text = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
    messages[first_user]["content"] = [*parts, *text]
    return messages
