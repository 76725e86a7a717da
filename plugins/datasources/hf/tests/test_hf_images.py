"""Images in the hf source: a ``datasets.Image`` column (decoded PIL images, undecoded ``{bytes, path}``
structs, a list of images filling the messages' placeholders, the same column read back from parquet)
becomes image parts of the prompt, checked at start-up with one line naming path, split and row; the
samples carry the image tokens and a JSON reference that rebuilds the column's pixels."""

import io
import json

import numpy as np
import pytest
from plasmid_hf_datasets import plugin
from plasmid_hf_datasets.options import MAX_IMAGE_PIXELS, HfDatasetOptions

from plasmid.errors import UsageError
from plasmid.testing import build, make_config
from plasmid_torch import vision

PIL = pytest.importorskip("PIL.Image")
datasets = pytest.importorskip("datasets")

COLOURS = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255)}


def picture(colour, size=(32, 32)):
    return PIL.new("RGB", size, COLOURS[colour])


def png(colour, size=(32, 32)) -> bytes:
    buffer = io.BytesIO()
    picture(colour, size).save(buffer, "PNG")
    return buffer.getvalue()


def image_dataset(colours, decode=True):
    """One row per colour: a text prompt, its colour as label and the picture in an ``Image()`` column."""
    features = datasets.Features({"prompt": datasets.Value("string"), "label": datasets.Value("string"),
                                  "image": datasets.Image(decode=decode)})
    rows = {"prompt": ["colour?"] * len(colours), "label": list(colours),
            "image": [{"bytes": png(colour), "path": None} for colour in colours]}
    return datasets.Dataset.from_dict(rows, features=features)


def vlm_source(tmp_path, vlm, hf_path, **options):
    options = {"datasource": "hf", "model": vlm, "hf_path": str(hf_path), "hf_apply_chat_template": True,
               "n_samples_per_prompt": 1, **options}
    return build("datasource", "hf", plugin, config=make_config(plugin, run_dir=tmp_path / "run", **options))


def drawn(source, n):
    return [group.samples[0] for group in source.get_groups(n)]


def pixels(vlm, sample):
    return vision.ImageInputs(vlm)(sample).pixel_values


@pytest.mark.parametrize("decode", [True, False], ids=["pil-images", "bytes-path-structs"])
def test_an_image_column_becomes_image_parts_with_image_tokens_and_a_json_reference(tmp_path, vlm, decode):
    colours = ["red", "blue", "red"]
    image_dataset(colours, decode).save_to_disk(str(tmp_path / "saved"))
    samples = drawn(vlm_source(tmp_path, vlm, tmp_path / "saved", hf_image_column="image"), 3)
    image_token = vision.VisionEncoder(vlm).image_token_id
    assert [sample.label for sample in samples] == colours
    for sample in samples:
        assert sample.tokens.count(image_token) == 4                     # 32x32: 4x4 patches merged 2x2
        (part,) = sample.metadata[vision.VISION_KEY]["images"]
        assert part["image"].startswith("data:")                          # PNG bytes, whatever the column held
        assert json.loads(json.dumps(sample.metadata)) == sample.metadata
        assert json.loads(json.dumps(sample.prompt)) == sample.prompt     # no PIL image or bytes left
        first, text = sample.prompt[0]["content"]
        assert first["type"] == "image" and text == {"type": "text", "text": "colour?"}
    red, blue, red_again = (pixels(vlm, sample) for sample in samples)
    expected = vision.ImageInputs(vlm).process([picture("red")]).pixel_values
    assert np.array_equal(red.numpy(), red_again.numpy()) and np.array_equal(red.numpy(), expected.numpy())
    assert not np.array_equal(red.numpy(), blue.numpy())


def test_a_list_of_images_fills_the_placeholders_of_chat_messages_in_order(tmp_path, vlm):
    features = datasets.Features({
        "messages": [{"role": datasets.Value("string"),
                      "content": [{"type": datasets.Value("string"), "text": datasets.Value("string")}]}],
        "images": datasets.Sequence(datasets.Image()), "label": datasets.Value("string")})
    content = [{"type": "image", "text": None}, {"type": "text", "text": "or"},
               {"type": "image", "text": None}, {"type": "text", "text": "?"}]
    rows = {"messages": [[{"role": "user", "content": content}]] * 2, "label": ["a", "b"],
            "images": [[png("red"), png("blue")], [png("green"), png("green")]]}
    datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(tmp_path / "saved"))
    source = vlm_source(tmp_path, vlm, tmp_path / "saved", hf_input_key="messages", hf_image_column="images")
    first, second = drawn(source, 2)
    assert first.tokens.count(vision.VisionEncoder(vlm).image_token_id) == 8
    assert [part.get("text") for part in first.prompt[0]["content"]] == [None, "or", None, "?"]
    images = first.metadata[vision.VISION_KEY]["images"]
    decoded = [np.asarray(vision.decode_image(part)) for part in images]
    assert [tuple(image[0, 0]) for image in decoded] == [COLOURS["red"], COLOURS["blue"]]
    assert not np.array_equal(pixels(vlm, first).numpy(), pixels(vlm, second).numpy())


def test_an_image_column_read_back_from_parquet_keeps_its_images(tmp_path, vlm):
    image_dataset(["green", "blue"]).to_parquet(str(tmp_path / "rows.parquet"))
    green, blue = drawn(vlm_source(tmp_path, vlm, tmp_path / "rows.parquet", hf_image_column="image"), 2)
    expected = vision.ImageInputs(vlm).process([picture("green")]).pixel_values
    assert np.array_equal(pixels(vlm, green).numpy(), expected.numpy())
    assert green.label == "green" and blue.label == "blue"


def test_paths_in_an_image_column_resolve_against_the_dataset_file(tmp_path, vlm, write_jsonl):
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "red.png").write_bytes(png("red"))
    path = write_jsonl("rows.jsonl", [{"prompt": "colour?", "label": "red", "image": "images/red.png"}])
    (sample,) = drawn(vlm_source(tmp_path, vlm, path, hf_image_column="image"), 1)
    assert sample.metadata[vision.VISION_KEY]["images"][0]["image"] == str(tmp_path / "images" / "red.png")


@pytest.mark.parametrize(("image", "options", "expected"), [
    (b"not an image", {}, "image 1: cannot decode the image"),
    (png("red", (64, 64)), {"hf_max_image_pixels": 32 * 32}, "image 1: image of 64x64 pixels is over the limit"),
])
def test_a_bad_image_stops_start_up_with_one_line_naming_path_split_and_row(tmp_path, vlm, image, options,
                                                                             expected):
    dataset = image_dataset(["red", "green"], decode=False)
    dataset = datasets.Dataset.from_dict({**dataset.to_dict(), "image": [dataset[0]["image"],
                                                                         {"bytes": image, "path": None}]},
                                         features=dataset.features)
    dataset.save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(UsageError) as caught:
        vlm_source(tmp_path, vlm, tmp_path / "saved", hf_image_column="image", **options)
    message = str(caught.value)
    assert message.startswith(f"--hf-path {tmp_path / 'saved'} (train), row 2: {expected}"), message
    assert "\n" not in message


def test_placeholders_that_do_not_match_the_images_are_one_line_naming_the_row(tmp_path, vlm, write_jsonl):
    rows = [{"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "?"}]}],
             "images": []}, {"messages": [{"role": "user", "content": [{"type": "image"}]}],
                             "images": ["a.png", "b.png"]}]
    path = write_jsonl("rows.jsonl", rows)
    with pytest.raises(UsageError, match=r"\(train\), row 1: image 1: image part .* has no image"):
        vlm_source(tmp_path, vlm, path, hf_input_key="messages", hf_image_column="images")
    path = write_jsonl("rows.jsonl", rows[1:])
    with pytest.raises(UsageError, match=r"\(train\), row 1: the messages have 1 image placeholders for 2 images"):
        vlm_source(tmp_path, vlm, path, hf_input_key="messages", hf_image_column="images")


def test_an_image_column_that_is_not_there_or_without_chat_is_refused_naming_the_flag(tmp_path, vlm):
    image_dataset(["red"]).save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(UsageError, match=r"^--hf-image-column picture: .* has no such column; its columns are "
                                         r"prompt, label, image$"):
        vlm_source(tmp_path, vlm, tmp_path / "saved", hf_image_column="picture")
    with pytest.raises(UsageError, match="^--hf-image-column image: images go into chat messages; add "
                                         "--hf-apply-chat-template$"):
        vlm_source(tmp_path, vlm, tmp_path / "saved", hf_image_column="image", hf_apply_chat_template=False)


def test_the_default_image_bound_is_the_vision_librarys():
    assert MAX_IMAGE_PIXELS == vision.MAX_IMAGE_PIXELS
    assert HfDatasetOptions.__dataclass_fields__["hf_max_image_pixels"].default == vision.MAX_IMAGE_PIXELS
