"""``--task colours``: which colour covers most of an image drawn in code; for a tiny vision-language model.

Item ``i``'s image is 32x32 pixels in a 2x2 grid of 16x16-pixel cells (each one image token of the tiny
VLM: 2x2 vision patches merged), every cell one of :data:`COLOURS`. One colour, the label, covers 3 or 4
of the 4 cells, and each other colour fewer; the cells are drawn by a random generator seeded with the
item, so an item is the same image everywhere. The prompt is one user message: the image (a PNG data URL, an OpenAI
``image_url`` part) and the question :data:`QUESTION`; the label is the colour's name, one word.

With no ``--model`` the recipe builds the tiny Qwen2-VL of :func:`plasmid_torch.tiny_vision.build_tiny_vlm`
(about 189k parameters) and gives it a short supervised warm start (:func:`warm_start`,
``--colours-warmup-steps``) on the same prompts answered with a colour drawn at random, independently of
the image: the model learns to answer with one colour word and ``<eos>``, not which one, so its greedy
eval accuracy starts near chance (1 / 4) and RL has a reward to follow.
"""

from __future__ import annotations

import base64
import io
import random
from typing import Any

from plasmid_tasks.warmstart import Extra, Row, supervised_steps
from plasmid_torch.tiny import EOS_ID, PAD_ID

#: The colours and their RGB values; the names are the labels.
COLOURS: dict[str, tuple[int, int, int]] = {"red": (220, 30, 30), "green": (30, 180, 30), "blue": (30, 60, 220),
                                            "yellow": (230, 210, 40)}
#: Image side in pixels and cells per side (cells of 16 pixels: 2x2 vision patches, one image token of the
#: tiny VLM each). Measured: with a 4x4 grid of 8-pixel cells and the label on 7-10 of them, RL stalled at
#: 0.65-0.8 greedy accuracy, one colour never answered, and supervised training on the labels as well (0.62
#: after 60 steps); on this grid a first-letter GRPO run of the same model reaches 1.0 by step 45.
SIDE, CELLS = 32, 2
#: How many of the ``CELLS * CELLS`` cells the most common colour covers, inclusive.
MOST_CELLS = (3, 4)
QUESTION = "which colour covers most of the image?"
#: Items of the task (distinct seeds; many more than a run visits).
DOMAIN_SIZE = 10**6
#: The warm start's defaults: steps (``--colours-warmup-steps``), learning rate and batch.
WARMUP_STEPS, WARMUP_LR, WARMUP_BATCH = 60, 3e-3, 32


def cell_colours(item: int) -> list[str]:
    """The colour of each of the ``CELLS * CELLS`` cells of item ``item``'s image, row by row."""
    rng = random.Random(f"colours:{item}")
    names = list(COLOURS)
    most = rng.choice(names)
    others = [name for name in names if name != most]
    count = rng.randint(*MOST_CELLS)
    while True:
        rest = [rng.choice(others) for _ in range(CELLS * CELLS - count)]
        if all(rest.count(name) < count for name in others):
            break
    cells = [most] * count + rest
    rng.shuffle(cells)
    return cells


def draw(cells: list[str]) -> Any:
    """The RGB PIL image of ``cells`` (:func:`cell_colours`)."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (SIDE, SIDE))
    pen = ImageDraw.Draw(image)
    size = SIDE // CELLS
    for index, name in enumerate(cells):
        row, column = divmod(index, CELLS)
        pen.rectangle([column * size, row * size, (column + 1) * size - 1, (row + 1) * size - 1], fill=COLOURS[name])
    return image


def most_common(cells: list[str]) -> str:
    """The colour covering the most cells (unique for :func:`cell_colours`)."""
    return max(COLOURS, key=cells.count)


def prompt(image: Any) -> list[dict[str, Any]]:
    """The chat prompt: one user message with ``image`` as a PNG data URL and :data:`QUESTION`."""
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": QUESTION}]}]


def example(item: int) -> tuple[list[dict[str, Any]], str]:
    """``(prompt messages, label)`` of item ``item``."""
    cells = cell_colours(item)
    return prompt(draw(cells)), most_common(cells)


def warm_start(model: Any, tokenizer: Any, image_processor: Any, *, items: list[int], steps: int, seed: int,
               lr: float = WARMUP_LR, batch_size: int = WARMUP_BATCH) -> list[float]:
    """``steps`` AdamW steps of next-token cross-entropy, on the answer tokens only, of the prompts of
    random ``items`` each answered with a colour drawn uniformly at random (not the label) and
    ``<eos>``. Deterministic for a ``seed``; leaves ``model`` in eval mode. :returns: each step's loss."""
    from plasmid_torch.vision import VisionEncoder, forward_inputs, load_images

    encoder = VisionEncoder.of(tokenizer, image_processor, model.config.image_token_id)
    rng = random.Random(f"colours-warmup:{seed}")

    def next_batch() -> tuple[list[Row], Extra]:
        rows, inputs = [], []
        for item in rng.sample(items, batch_size):
            messages = example(item)[0]
            ids, vision = encoder(messages, load_images(messages, f"--task colours, item {item}"))
            answer = list(tokenizer(rng.choice(list(COLOURS)), add_special_tokens=False)["input_ids"]) + [EOS_ID]
            rows.append((ids + answer, [-100] * len(ids) + answer))
            inputs.append(vision)
        return rows, lambda input_ids: forward_inputs(model, input_ids, inputs)

    return supervised_steps(model, next_batch, steps=steps, lr=lr, pad_id=PAD_ID)
