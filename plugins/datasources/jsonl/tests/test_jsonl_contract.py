"""The jsonl source keeps the data-source contract, on the shipped example and on parquet chats."""

import pytest
from plasmid_jsonl import plugin

from plasmid.testing import DataSourceContract


class TestShuffledExampleFile(DataSourceContract):
    """``examples/mod10.jsonl`` (100 prompts) shuffled each epoch, and evaluated on itself."""

    plugin = plugin
    provider = "jsonl"
    config_options = {"rollout_shuffle": True}

    @pytest.fixture
    def datasource_options(self, tiny_model, example_file):
        return {"model": tiny_model, "prompt_data": example_file, "eval_prompt_data": example_file}


class TestChatMessagesFromParquet(DataSourceContract):
    """Chat prompts in a parquet file, in file order, through the model's chat template."""

    plugin = plugin
    provider = "jsonl"

    @pytest.fixture
    def datasource_options(self, chat_model, write_parquet):
        rows = [{"messages": [{"role": "user", "content": f"{n}+{n}="}], "answer": str(2 * n % 10),
                 "metadata": {"n": n}} for n in range(40)]
        data = write_parquet("chats.parquet", rows)
        return {"model": chat_model, "prompt_data": data, "eval_prompt_data": data, "input_key": "messages",
                "label_key": "answer", "apply_chat_template": True}
