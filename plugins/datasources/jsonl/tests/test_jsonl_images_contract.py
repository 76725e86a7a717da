"""The jsonl source claims prompts with images in the data-source contract: jsonl rows whose chat
messages have image files and data URLs, and parquet rows whose image parts hold the PNG bytes
themselves; their references survive a checkpoint and rebuild the same pixels."""

import base64
import io

import pytest
from plasmid_jsonl import plugin

from plasmid.testing import DataSourceContract
from plasmid_torch import vision

PIL = pytest.importorskip("PIL.Image")

#: Eight colours, so that neighbouring prompts differ.
COLOURS = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0), (0, 255, 255), (255, 0, 255), (0, 0, 0),
           (255, 255, 255)]


def png(colour) -> bytes:
    buffer = io.BytesIO()
    PIL.new("RGB", (32, 32), colour).save(buffer, "PNG")
    return buffer.getvalue()


def messages(part):
    return [{"role": "user", "content": [part, {"type": "text", "text": "colour?"}]}]


@pytest.fixture
def rebuild_pixels(vlm):
    images = vision.ImageInputs(vlm)
    return lambda sample: images(sample).pixel_values.numpy().tobytes()


class TestJsonlRowsWithImageFilesAndDataUrls(DataSourceContract):
    """40 rows: even ones an image file beside the data (a relative path), odd ones a data URL;
    shuffled each epoch."""

    plugin = plugin
    provider = "jsonl"
    image_metadata_key = vision.VISION_KEY
    config_options = {"rollout_shuffle": True, "apply_chat_template": True}

    @pytest.fixture
    def rebuild_images(self, rebuild_pixels):
        return rebuild_pixels

    @pytest.fixture
    def datasource_options(self, vlm, write_jsonl, tmp_path):
        (tmp_path / "images").mkdir()
        rows = []
        for n in range(40):
            colour = COLOURS[n % len(COLOURS)]
            if n % 2 == 0:
                (tmp_path / "images" / f"{n}.png").write_bytes(png(colour))
                part = {"type": "image_url", "image_url": {"url": f"images/{n}.png"}}
            else:
                part = {"type": "image_url", "image_url": {"url": "data:image/png;base64,"
                                                                  + base64.b64encode(png(colour)).decode()}}
            rows.append({"prompt": messages(part), "label": str(n % len(COLOURS))})
        data = write_jsonl("images.jsonl", rows)
        return {"model": vlm, "prompt_data": data, "eval_prompt_data": data}


class TestParquetRowsWithImageBytes(DataSourceContract):
    """30 parquet rows whose Hugging Face image parts hold the PNG bytes (a binary field), one in
    three a text-only prompt, in file order."""

    plugin = plugin
    provider = "jsonl"
    image_metadata_key = vision.VISION_KEY
    config_options = {"apply_chat_template": True, "input_key": "messages", "label_key": "answer"}

    @pytest.fixture
    def rebuild_images(self, rebuild_pixels):
        return rebuild_pixels

    @pytest.fixture
    def datasource_options(self, vlm, write_parquet):
        rows = [{"messages": [{"role": "user", "content": [{"type": "text", "text": "colour?"}]}] if n % 3 == 2
                 else messages({"type": "image", "bytes": png(COLOURS[n % len(COLOURS)])}), "answer": str(n)}
                for n in range(30)]
        data = write_parquet("images.parquet", rows)
        return {"model": vlm, "prompt_data": data, "eval_prompt_data": data}
