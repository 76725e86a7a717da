"""jsonl rows whose chat messages have images: every accepted part form decoded at start-up, relative
paths against the file, a bad image one line naming file:line, and samples that carry expanded image
tokens and a JSON reference that rebuilds the same pixels wherever the run reads it again."""

import base64
import io
import json

import pytest
import torch

from plasmid.errors import UsageError
from plasmid.testing import build
from plasmid_torch import vision

PIL = pytest.importorskip("PIL.Image")


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    from plasmid_torch.tiny_vision import build_tiny_vlm

    return str(build_tiny_vlm(tmp_path_factory.mktemp("models") / "vlm"))


def png(colour) -> bytes:
    buffer = io.BytesIO()
    PIL.new("RGB", (32, 32), colour).save(buffer, "PNG")
    return buffer.getvalue()


def row(part, label):
    return {"prompt": [{"role": "user", "content": [part, {"type": "text", "text": "colour?"}]}], "label": label}


def test_rows_with_images_in_each_form_become_samples_with_image_tokens_and_json_references(
        jsonl_config, write_jsonl, tmp_path, vlm):
    from plasmid_jsonl import plugin

    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "red.png").write_bytes(png((255, 0, 0)))
    url = "data:image/png;base64," + base64.b64encode(png((0, 0, 255))).decode()
    path = write_jsonl("rows.jsonl", [row({"type": "image_url", "image_url": {"url": "images/red.png"}}, "red"),
                                      row({"type": "image_url", "image_url": {"url": url}}, "blue"),
                                      row({"type": "image", "path": "images/red.png"}, "red")])
    config = jsonl_config(model=vlm, prompt_data=path, apply_chat_template=True, n_samples_per_prompt=1)
    samples = [group.samples[0] for group in build("datasource", "jsonl", plugin, config=config).get_groups(3)]
    encoder = vision.VisionEncoder(vlm)
    images = vision.ImageInputs(vlm)
    for sample in samples:
        assert sample.tokens.count(encoder.image_token_id) == 4          # 32x32: 4x4 patches merged 2x2
        json.loads(json.dumps(sample.metadata))                          # checkpoints save it as JSON
        (part,) = sample.metadata[vision.VISION_KEY]["images"]
        assert part["image"].startswith(("data:", str(tmp_path)))        # no relative path is left
    red, blue, red_again = (images(sample).pixel_values for sample in samples)
    assert torch.equal(red, red_again) and not torch.equal(red, blue)


@pytest.mark.parametrize(("part", "expected"), [
    ({"type": "image", "path": "missing.png"}, "image 1: cannot read image"),
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64,!!"}}, "image 1: data URL"),
    ({"type": "image", "bytes": None}, "image 1: image part"),
])
def test_a_bad_image_stops_start_up_with_one_line_naming_file_and_row(jsonl_config, write_jsonl, vlm, part,
                                                                        expected):
    from plasmid_jsonl import plugin

    good = row({"type": "image_url", "image_url": {"url": "data:image/png;base64,"
                                                          + base64.b64encode(png((0, 255, 0))).decode()}}, "green")
    path = write_jsonl("rows.jsonl", [good, row(part, "x")])
    config = jsonl_config(model=vlm, prompt_data=path, apply_chat_template=True)
    with pytest.raises(UsageError) as caught:
        build("datasource", "jsonl", plugin, config=config)
    assert str(caught.value).startswith(f"{path}:2: {expected}") and "\n" not in str(caught.value)


def test_images_for_a_text_only_model_are_refused_naming_it(jsonl_config, write_jsonl, chat_model):
    from plasmid_jsonl import plugin

    path = write_jsonl("rows.jsonl", [row({"type": "image", "bytes": None}, "x")])
    config = jsonl_config(model=chat_model, prompt_data=path, apply_chat_template=True)
    with pytest.raises(UsageError, match="not a vision-language model"):
        build("datasource", "jsonl", plugin, config=config)
