"""plasmid_serving.images: a sample's images as HTTP engines send them (no server, no torch)."""

from __future__ import annotations

import base64
import importlib.util
import json
from types import SimpleNamespace

import pytest

from plasmid.errors import ProviderError, UsageError
from plasmid_serving.images import (
    VISION_KEY,
    ServedImages,
    collapse_image_tokens,
    data_url,
    takes_images,
    vocab_size_of,
)
from plasmid_serving.names import EngineNames

NAMES = EngineNames("Fake", "fake", "plasmid-fake")
PNG = b"\x89PNG\r\n\x1a\nnot really"


@pytest.fixture
def vlm(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"vision_config": {}, "image_token_id": 5,
                                                      "text_config": {"vocab_size": 50}}))
    return ServedImages(str(tmp_path), NAMES)


def sample(*parts, index=2):
    return SimpleNamespace(index=index, metadata={VISION_KEY: {"images": list(parts)}})


def test_runs_of_image_tokens_collapse_to_one_per_image_and_must_match_the_images():
    assert collapse_image_tokens([1, 5, 5, 5, 4, 5, 5, 2], 5, 2) == [1, 5, 4, 5, 2]
    assert collapse_image_tokens([1, 4], 5, 0) == [1, 4]
    with pytest.raises(ValueError, match="the prompt has 1 runs of image token 5 for 2 images"):
        collapse_image_tokens([1, 5, 5, 4], 5, 2)


def test_a_path_becomes_a_data_url_and_a_data_url_stays_as_it_is(tmp_path):
    (tmp_path / "red.png").write_bytes(PNG)
    assert data_url({"type": "image", "image": str(tmp_path / "red.png")}) == \
        "data:image/png;base64," + base64.b64encode(PNG).decode()
    assert data_url({"type": "image", "image": "data:image/png;base64,AAAA"}) == "data:image/png;base64,AAAA"
    with pytest.raises(ValueError, match="cannot read image .*missing.png"):
        data_url({"type": "image", "image": str(tmp_path / "missing.png")})


def test_a_samples_images_are_data_urls_in_prompt_order(vlm, tmp_path):
    (tmp_path / "a.jpg").write_bytes(b"jpeg bytes")
    urls = vlm(sample({"type": "image", "image": "data:image/png;base64,AAAA"},
                      {"type": "image", "image": str(tmp_path / "a.jpg")}))
    assert urls == ["data:image/png;base64,AAAA", "data:image/jpeg;base64," + base64.b64encode(b"jpeg bytes").decode()]
    assert vlm.vision and vlm.image_token_id == 5 and vlm.server_prompt([1, 5, 5, 2], urls[:1]) == [1, 5, 2]


def test_a_bad_reference_or_an_unreadable_image_is_one_error_naming_the_engine_and_the_sample(vlm, tmp_path):
    with pytest.raises(UsageError, match=r"^engine 'fake' \(plugin plasmid-fake, model .*\): sample 2: "
                                         r"metadata\['plasmid_torch.vision'\] must be"):
        vlm(SimpleNamespace(index=2, metadata={VISION_KEY: {"images": []}}))
    with pytest.raises(UsageError, match=r"^engine 'fake' .*: sample 4: cannot read image .*gone.png"):
        vlm(sample({"type": "image", "image": str(tmp_path / "gone.png")}, index=4))


def test_a_text_only_model_refuses_images_naming_the_engine(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 16}))
    text = ServedImages(str(tmp_path), NAMES)
    assert not text.vision and not takes_images(str(tmp_path))
    with pytest.raises(UsageError, match=r"^engine 'fake' \(plugin plasmid-fake, model .*\): sample 2 has images, "
                                         r"but the model is text-only \(its config.json has no vision_config\)"):
        text(sample({"type": "image", "image": "data:image/png;base64,AAAA"}))


def test_a_server_expanding_into_other_ids_than_plasmids_is_an_error_naming_it(vlm):
    vlm.check_expansion("server 0", [1, 5, 5, 2], [1, 5, 5, 2])
    vlm.check_expansion("server 0", 4, [1, 5, 5, 2])
    with pytest.raises(ProviderError, match=r"fake generate: server 0 expanded the prompt with its images into "
                                            r"other ids \(5 tokens\) than plasmid's \(4 tokens\)"):
        vlm.check_expansion("server 0", 5, [1, 5, 5, 2])
    with pytest.raises(ProviderError, match=r"other ids \(4 tokens\)"):
        vlm.check_expansion("server 0", [1, 5, 5, 3], [1, 5, 5, 2])


def test_the_vocabulary_of_a_vision_language_model_is_its_text_configs():
    assert vocab_size_of({"vocab_size": 16}) == 16
    assert vocab_size_of({"text_config": {"vocab_size": 50}, "vision_config": {}}) == 50
    assert vocab_size_of({}) == 0


@pytest.mark.skipif(importlib.util.find_spec("plasmid_torch") is None, reason="plasmid-torch is not installed")
def test_the_metadata_key_is_plasmid_torchs():
    from plasmid_torch.vision import VISION_KEY as TORCH_KEY

    assert VISION_KEY == TORCH_KEY
