"""A tiny Qwen2-VL-style vision-language model and its processor, built in code (no downloads).

The model is transformers' ``Qwen2VLForConditionalGeneration`` with a tiny config (a few text layers,
a small vision tower with 8-pixel patches); its processor is a character-level tokenizer
(:func:`plasmid_torch.tiny.char_tokenizer`'s scheme, plus the vision special tokens) and the PIL
``Qwen2VLImageProcessor``. :func:`build_tiny_vlm` saves all three with ``save_pretrained``.

Sizes: an image is resized to a multiple of ``patch_size * merge_size`` (16 pixels) between
:data:`TINY_MIN_PIXELS` and :data:`TINY_MAX_PIXELS`; a 64x64 image becomes an 8x8 grid of patches and
16 ``<|image_pad|>`` tokens after the 2x2 merge. Imports torch and transformers when called.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from plasmid_torch.tiny import BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS, save_model_dir

#: The vision special tokens, ids right after :data:`plasmid_torch.tiny.SPECIAL_TOKENS`.
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
VISION_START_ID, VISION_END_ID, IMAGE_PAD_ID, VIDEO_PAD_ID = range(len(SPECIAL_TOKENS),
                                                                   len(SPECIAL_TOKENS) + len(VISION_TOKENS))
#: Characters of the tiny VLM's vocabulary: lower-case letters, digits, space and some punctuation.
VISION_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789 .,?:'-"
#: Vision tower geometry: 8x8-pixel patches, 2x2 merged into one text token, two frames a patch.
TINY_PATCH, TINY_MERGE, TINY_TEMPORAL = 8, 2, 2
#: Pixel bounds of the tiny image processor: 32x32 (4 image tokens) to 64x64 (16 image tokens).
TINY_MIN_PIXELS, TINY_MAX_PIXELS = 32 * 32, 64 * 64

#: The tiny VLM's chat template. As :data:`plasmid_torch.tiny.CHAT_TEMPLATE`: a ``system``/``user``/
#: ``tool`` message is ``<bos>`` + its content, an ``assistant`` message its content + ``<eos>``, an
#: empty generation prompt. Content may be a string or a list of parts: ``text`` parts are their text,
#: ``image`` and ``image_url`` parts ``<|vision_start|><|image_pad|><|vision_end|>`` (the processor
#: expands ``<|image_pad|>`` to the image's token count).
VISION_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] in ['system', 'user', 'tool'] -%}{{ bos_token }}"
    "{%- elif message['role'] != 'assistant' -%}"
    "{{ raise_exception('the tiny VLM\\'s chat template has no role ' + message['role']) }}"
    "{%- endif -%}"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for part in message['content'] or [] -%}"
    "{%- if part['type'] in ['image', 'image_url'] -%}<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif part['type'] == 'text' -%}{{ part['text'] }}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{%- if message['role'] == 'assistant' -%}{{ eos_token }}{%- endif -%}"
    "{%- endfor -%}"
)


def vision_tokenizer(alphabet: str = VISION_ALPHABET, max_length: int = 256) -> Any:
    """A character tokenizer (one token per character of ``alphabet``) with the vision tokens.

    Ids: ``<pad>`` 0, ``<bos>`` 1, ``<eos>`` 2, the :data:`VISION_TOKENS` 3-6, then ``alphabet``.
    Encoding prepends ``<bos>``; it has :data:`VISION_CHAT_TEMPLATE` and the attributes
    ``Qwen2VLProcessor`` reads (``image_token``, ``vision_start_token``, ...).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    if len(set(alphabet)) != len(alphabet):
        raise ValueError(f"alphabet has repeated characters: {alphabet!r}")
    specials = SPECIAL_TOKENS + VISION_TOKENS
    vocab = {token: i for i, token in enumerate(specials)}
    vocab.update({char: len(specials) + i for i, char in enumerate(alphabet)})
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=None))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A $B",
                                                        special_tokens=[("<bos>", BOS_ID)])
    core.add_special_tokens(list(specials))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", padding_side="left",
        model_max_length=max_length,
        extra_special_tokens={"image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
                              "vision_start_token": "<|vision_start|>", "vision_end_token": "<|vision_end|>"})
    tokenizer.chat_template = VISION_CHAT_TEMPLATE
    return tokenizer


def tiny_image_processor() -> Any:
    """The PIL ``Qwen2VLImageProcessor`` with the tiny geometry (:data:`TINY_PATCH`, :data:`TINY_MERGE`,
    :data:`TINY_MIN_PIXELS`..:data:`TINY_MAX_PIXELS`)."""
    from transformers import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(patch_size=TINY_PATCH, merge_size=TINY_MERGE, temporal_patch_size=TINY_TEMPORAL,
                                    min_pixels=TINY_MIN_PIXELS, max_pixels=TINY_MAX_PIXELS,
                                    size={"shortest_edge": TINY_MIN_PIXELS, "longest_edge": TINY_MAX_PIXELS})


def tiny_vision_config(vocab_size: int, hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4,
                       vision_depth: int = 2, vision_width: int = 32, max_positions: int = 256) -> Any:
    """A ``Qwen2VLConfig``: a Qwen2 text model (FFN 4x hidden, tied embeddings, multimodal rotary
    sections summing to half the head size) and a vision tower of ``vision_depth`` blocks of width
    ``vision_width`` whose merger outputs ``hidden_size``."""
    import transformers

    head_dim = hidden_size // num_heads
    if head_dim % 8:
        raise ValueError(f"hidden_size / num_heads must be a multiple of 8 for mrope, got {head_dim}")
    quarter = head_dim // 8      # mrope sections (temporal, height, width) over head_dim / 2 frequencies
    text = dict(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=4 * hidden_size,
                num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_heads,
                max_position_embeddings=max_positions, bos_token_id=BOS_ID, eos_token_id=EOS_ID,
                pad_token_id=PAD_ID,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                 "mrope_section": [2 * quarter, quarter, quarter]})
    vision = dict(depth=vision_depth, embed_dim=vision_width, hidden_size=hidden_size, num_heads=2,
                  mlp_ratio=2, patch_size=TINY_PATCH, spatial_merge_size=TINY_MERGE,
                  temporal_patch_size=TINY_TEMPORAL, in_channels=3)
    return transformers.Qwen2VLConfig(text_config=text, vision_config=vision, image_token_id=IMAGE_PAD_ID,
                                      video_token_id=VIDEO_PAD_ID, vision_start_token_id=VISION_START_ID,
                                      vision_end_token_id=VISION_END_ID, tie_word_embeddings=True)


def build_tiny_vlm(directory: str | os.PathLike[str], *, seed: int = 0, alphabet: str = VISION_ALPHABET,
                   warm_start: Callable[[Any, Any, Any], None] | None = None, **config_kwargs: Any) -> Path:
    """Initialise a tiny Qwen2-VL with ``seed`` (:func:`tiny_vision_config` with ``config_kwargs``) and
    save it with its tokenizer (:func:`vision_tokenizer`) and image processor (:func:`tiny_image_processor`)
    to ``directory``, whole or not at all (:func:`plasmid_torch.tiny.save_model_dir`). ``warm_start``,
    when given, is called as ``warm_start(model, tokenizer, image_processor)`` before the save (a
    recipe's supervised steps; it leaves the model in eval mode).

    The directory loads with ``AutoModelForImageTextToText``, ``AutoTokenizer`` and ``AutoImageProcessor``
    (:class:`plasmid_torch.vision.VisionEncoder` does). It has no ``processor_config.json``: transformers
    5.25 cannot build ``Qwen2VLProcessor`` without torchvision (its video processor check fails), so
    ``AutoProcessor`` is not the loader here. :returns: the directory.
    """
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    tokenizer = vision_tokenizer(alphabet, max_length=config_kwargs.get("max_positions", 256))
    config = tiny_vision_config(len(tokenizer), **config_kwargs)
    torch.manual_seed(seed)
    model = transformers.Qwen2VLForConditionalGeneration(config)
    image_processor = tiny_image_processor()
    if warm_start is not None:
        warm_start(model, tokenizer, image_processor)
    return save_model_dir(model, _Savers(tokenizer, image_processor), directory)


class _Savers:
    """Several objects saved into one directory by one ``save_pretrained`` call."""

    def __init__(self, *parts: Any) -> None:
        self.parts = parts

    def save_pretrained(self, directory: str | os.PathLike[str]) -> None:
        for part in self.parts:
            part.save_pretrained(directory)
