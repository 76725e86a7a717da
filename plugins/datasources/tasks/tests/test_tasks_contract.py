"""The tasks source keeps the data-source contract, with and without the quickstart recipe."""

import pytest
from plasmid_tasks import plugin

from plasmid.testing import DataSourceContract
from plasmid_torch.vision import VISION_KEY


class TestMod10WithTheQuickstartRecipe(DataSourceContract):
    """As the quickstart runs it: the recipe builds the tiny model and its tokenizer encodes."""

    plugin = plugin
    provider = "tasks"


class TestReverseWithoutAModel(DataSourceContract):
    """A held-out task encoded by the built-in char encoding (no model, no recipe): 100 prompts,
    20 held out, so the resume test crosses epochs."""

    plugin = plugin
    provider = "tasks"
    config_options = {"datasource": None, "task": "reverse", "task_length": 2, "task_eval_size": 20}


class TestColoursWithAVisionLanguageModel(DataSourceContract):
    """``--task colours`` on a given tiny Qwen2-VL: every prompt has an image drawn in code, and the
    source claims images (its references survive a checkpoint and rebuild the same pixels)."""

    plugin = plugin
    provider = "tasks"
    config_options = {"task": "colours", "task_eval_size": 8}
    image_metadata_key = VISION_KEY

    @pytest.fixture(scope="class")
    @classmethod
    def vlm(cls, tmp_path_factory):
        from plasmid_torch.tiny_vision import build_tiny_vlm

        return str(build_tiny_vlm(tmp_path_factory.mktemp("models") / "vlm"))

    @pytest.fixture
    def datasource_options(self, vlm):
        return {"model": vlm}

    @pytest.fixture
    def rebuild_images(self, vlm):
        from plasmid_torch.vision import ImageInputs

        images = ImageInputs(vlm)
        return lambda sample: images(sample).pixel_values.numpy().tobytes()
