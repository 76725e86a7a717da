"""The hf source keeps the data-source contract: on a saved DatasetDict with nested columns,
shuffled each epoch and filtered by prompt length, on chat prompts from a parquet file, and (claiming
images) on a saved dataset's image column."""

import pytest
from plasmid_hf_datasets import plugin

from plasmid.testing import DataSourceContract
from plasmid_torch.vision import VISION_KEY


class TestSavedDatasetDictShuffled(DataSourceContract):
    """A ``save_to_disk`` directory with train/test splits, labels in a struct column,
    shuffled per epoch, with a prompt-length filter that keeps every row."""

    plugin = plugin
    provider = "hf"
    config_options = {"hf_shuffle": True, "hf_label_key": "reward_model.ground_truth", "hf_metadata_key": "extra",
                      "hf_eval_split": "test", "hf_max_prompt_tokens": 16}

    @pytest.fixture
    def datasource_options(self, tiny_model, save_dataset, verl_rows):
        return {"model": tiny_model, "hf_path": save_dataset("verl", {"train": verl_rows, "test": verl_rows[:5]})}


class TestChatMessagesFromParquet(DataSourceContract):
    """Chat prompts in a parquet file, in file order, through the model's chat template."""

    plugin = plugin
    provider = "hf"

    @pytest.fixture
    def datasource_options(self, chat_model, tmp_path):
        import pyarrow
        import pyarrow.parquet

        rows = [{"messages": [{"role": "user", "content": f"{n}+{n}="}], "answer": str(2 * n % 10)}
                for n in range(40)]
        path = tmp_path / "chats.parquet"
        pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), path)
        return {"model": chat_model, "hf_path": str(path), "hf_eval_split": "train", "hf_input_key": "messages",
                "hf_label_key": "answer", "hf_apply_chat_template": True}


class TestImageColumnOfASavedDataset(DataSourceContract):
    """A saved dataset whose ``Image()`` column holds each row's picture (four colours), shuffled each
    epoch: the source claims images, and their references survive a checkpoint with the same pixels."""

    plugin = plugin
    provider = "hf"
    image_metadata_key = VISION_KEY
    config_options = {"hf_image_column": "image", "hf_apply_chat_template": True, "hf_shuffle": True,
                      "hf_eval_split": "train"}

    @pytest.fixture
    def datasource_options(self, vlm, tmp_path):
        import io

        import datasets
        from PIL import Image

        def png(n):
            buffer = io.BytesIO()
            Image.new("RGB", (32, 32), (60 * (n % 4), 255 - 60 * (n % 4), 0)).save(buffer, "PNG")
            return buffer.getvalue()

        features = datasets.Features({"prompt": datasets.Value("string"), "label": datasets.Value("string"),
                                      "image": datasets.Image()})
        rows = {"prompt": ["colour?"] * 40, "label": [str(n % 4) for n in range(40)],
                "image": [{"bytes": png(n), "path": None} for n in range(40)]}
        datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(tmp_path / "saved"))
        return {"model": vlm, "hf_path": str(tmp_path / "saved")}

    @pytest.fixture
    def rebuild_images(self, vlm):
        from plasmid_torch.vision import ImageInputs

        images = ImageInputs(vlm)
        return lambda sample: images(sample).pixel_values.numpy().tobytes()
