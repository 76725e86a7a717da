"""jsonl rows whose chat messages have images: every accepted part form decoded at start-up, relative
paths against the file, a bad image one line naming file:line, and samples that carry expanded image
tokens and a JSON reference that rebuilds the same pixels wherever the run reads it again; and a field
of images (--image-key), a datasets Image column written to parquet included."""

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


def test_an_image_field_fills_placeholders_or_goes_first_and_reads_a_datasets_parquet_image_column(
        jsonl_config, write_jsonl, write_parquet, tmp_path, vlm):
    from plasmid_jsonl import plugin

    (tmp_path / "red.png").write_bytes(png((255, 0, 0)))
    text_row = {"prompt": "colour?", "label": "red", "image": "red.png"}
    placeholder_row = {"prompt": [{"role": "user", "content": [{"type": "text", "text": "which"},
                                                               {"type": "image"}]}], "label": "blue",
                       "image": ["data:image/png;base64," + base64.b64encode(png((0, 0, 255))).decode()]}
    path = write_jsonl("rows.jsonl", [text_row, placeholder_row])
    config = jsonl_config(model=vlm, prompt_data=path, apply_chat_template=True, image_key="image",
                          n_samples_per_prompt=1)
    red, blue = (group.samples[0] for group in build("datasource", "jsonl", plugin, config=config).get_groups(2))
    assert [part["type"] for part in red.prompt[0]["content"]] == ["image", "text"]
    assert red.metadata[vision.VISION_KEY]["images"][0]["image"] == str(tmp_path / "red.png")
    assert [part["type"] for part in blue.prompt[0]["content"]] == ["text", "image"]
    images = vision.ImageInputs(vlm)
    assert not torch.equal(images(red).pixel_values, images(blue).pixel_values)

    rows = [{"prompt": "colour?", "label": label, "picture": {"bytes": png(colour), "path": None}}
            for label, colour in (("red", (255, 0, 0)), ("blue", (0, 0, 255)))]    # datasets' Image() in parquet
    config = jsonl_config(model=vlm, prompt_data=write_parquet("images.parquet", rows), apply_chat_template=True,
                          image_key="picture", n_samples_per_prompt=1)
    from_parquet = [group.samples[0] for group in build("datasource", "jsonl", plugin, config=config).get_groups(2)]
    assert torch.equal(images(from_parquet[0]).pixel_values, images(red).pixel_values)
    assert torch.equal(images(from_parquet[1]).pixel_values, images(blue).pixel_values)


def test_image_field_errors_are_one_line_naming_file_and_row(jsonl_config, write_jsonl, vlm):
    from plasmid_jsonl import plugin

    path = write_jsonl("rows.jsonl", [{"prompt": "colour?", "image": png((1, 2, 3)).hex()}])
    config = jsonl_config(model=vlm, prompt_data=path, apply_chat_template=True, image_key="image")
    with pytest.raises(UsageError) as caught:
        build("datasource", "jsonl", plugin, config=config)
    assert str(caught.value).startswith(f"{path}:1: image 1: cannot read image")
    path = write_jsonl("rows.jsonl", [{"prompt": "colour?", "image": 7}])
    config = jsonl_config(model=vlm, prompt_data=path, apply_chat_template=True, image_key="image")
    with pytest.raises(UsageError, match=rf"^{path}:1: an image must be a PIL image, bytes, a path"):
        build("datasource", "jsonl", plugin, config=config)
    big = write_jsonl("big.jsonl", [{"prompt": "colour?", "image": "data:image/png;base64,"
                                     + base64.b64encode(png((1, 2, 3))).decode()}])
    config = jsonl_config(model=vlm, prompt_data=big, apply_chat_template=True, image_key="image",
                          max_image_pixels=31 * 31)
    with pytest.raises(UsageError, match=rf"^{big}:1: image 1: image of 32x32 pixels is over the limit of 961"):
        build("datasource", "jsonl", plugin, config=config)
    with pytest.raises(UsageError, match="^--image-key image: images go into chat messages; add "
                                         "--apply-chat-template$"):
        jsonl_config(model=vlm, prompt_data=big, image_key="image")


def test_the_default_image_bound_is_the_vision_librarys():
    from plasmid_jsonl.options import JsonlOptions

    assert JsonlOptions.__dataclass_fields__["max_image_pixels"].default == vision.MAX_IMAGE_PIXELS
