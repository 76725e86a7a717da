"""plasmid_torch.chat_images: what images arriving at run time may be, and how a rendered prompt's image
tokens are expanded to the model's count."""

from __future__ import annotations

import base64
import io

import pytest

PIL = pytest.importorskip("PIL.Image")

from plasmid_torch.chat_images import ChatImages, ImageLimits, check_count, check_image, engine_images  # noqa: E402
from plasmid_torch.tiny_vision import IMAGE_PAD_ID, build_tiny_vlm  # noqa: E402
from plasmid_torch.vision import VISION_KEY  # noqa: E402


def png(width: int = 32, height: int = 32) -> bytes:
    buffer = io.BytesIO()
    PIL.new("RGB", (width, height), (10, 20, 30)).save(buffer, "PNG")
    return buffer.getvalue()


def part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


DATA = "data:image/png;base64," + base64.b64encode(png()).decode()


def test_a_data_url_is_decoded_and_kept_as_its_portable_part():
    checked = check_image(part(DATA), "here", ImageLimits())
    assert checked.image.size == (32, 32) and checked.part == {"type": "image", "image": DATA}


def test_a_local_path_is_read_only_when_allowed_and_absolute(tmp_path):
    path = tmp_path / "a.png"
    path.write_bytes(png())
    assert check_image(part(str(path)), "f", ImageLimits(allow_paths=True)).part == {"type": "image",
                                                                                     "image": str(path)}
    assert check_image(part(f"file://{path}"), "f", ImageLimits(allow_paths=True)).image.size == (32, 32)
    with pytest.raises(ValueError, match=r"^f: '.*a.png' is a local file, and local files are not read here"):
        check_image(part(str(path)), "f", ImageLimits())
    with pytest.raises(ValueError, match="^f: 'a.png' is a relative path"):
        check_image(part("a.png"), "f", ImageLimits(allow_paths=True))


@pytest.mark.parametrize(("given", "limits", "message"), [
    (part("https://x.org/a.png"), ImageLimits(allow_paths=True), "is not read (no downloads)"),
    (part("data:image/png;base64," + base64.b64encode(b"junk").decode()), ImageLimits(),
     "cannot decode the image"),
    (part("data:image/png;base64," + base64.b64encode(png(40, 30)).decode()), ImageLimits(max_pixels=1000),
     "image of 40x30 pixels is over the limit of 1000 pixels"),
    ({"type": "text", "text": "x"}, ImageLimits(), "not an image part"),
    ({"type": "image_url"}, ImageLimits(), "has no image"),
])
def test_a_bad_image_is_one_line_starting_with_where_it_was(given, limits, message):
    with pytest.raises(ValueError) as caught:
        check_image(given, "'messages[1].content[0]'", limits)
    text = str(caught.value)
    assert text.startswith("'messages[1].content[0]': ") and message in text and "\n" not in text


def test_too_many_images_name_the_limit():
    check_count(2, "w", ImageLimits(max_images=2))
    with pytest.raises(ValueError, match="^w: 3 images, over the limit of 2$"):
        check_count(3, "w", ImageLimits(max_images=2))


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    return build_tiny_vlm(tmp_path_factory.mktemp("vlm") / "tiny-vlm", seed=0)


def test_each_image_token_is_expanded_to_its_images_count(vlm_dir):
    vision = ChatImages(vlm_dir)
    small, large = check_image(part(DATA), "a", ImageLimits()).image, PIL.new("RGB", (64, 64))
    counts = vision.counts(vision.inputs([small, large]))
    assert counts == [4, 16]
    assert vision.expand([1, IMAGE_PAD_ID, 9, IMAGE_PAD_ID, 8], counts) == [1, *[IMAGE_PAD_ID] * 4, 9,
                                                                            *[IMAGE_PAD_ID] * 16, 8]
    with pytest.raises(ValueError, match="the chat template placed 1 image tokens for 2 images"):
        vision.expand([IMAGE_PAD_ID], counts)


def test_a_text_model_is_not_a_chat_images_model(tmp_path):
    from plasmid_torch.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "text", seed=0)
    with pytest.raises(ValueError, match="is not a vision-language model"):
        ChatImages(model)


def test_the_engine_gets_what_its_own_images_makes_of_the_reference():
    class Engine:
        def images(self, sample):
            return ("made", sample.metadata[VISION_KEY])

        async def generate_with_images(self, prompt_ids, images, params): ...

    parts = [{"type": "image", "image": DATA}]
    assert engine_images(Engine(), parts) == ("made", {"images": parts})
    with pytest.raises(ValueError, match="the rollout engine object takes no images"):
        engine_images(object(), parts)
