"""The jsonl options are declared once: a bad value is a one-line error naming its flag, and the
typed read gives the declared defaults."""

from pathlib import Path

import pytest
from plasmid_jsonl import plugin
from plasmid_jsonl.options import JsonlOptions
from plasmid_jsonl.reader import Keys
from plasmid_jsonl.source import JsonlSource

from plasmid.errors import UsageError
from plasmid.testing import make_config


def another_source(**options):
    """A configuration where ``jsonl`` is installed but another source is chosen (so the files
    named need not exist)."""
    return make_config(plugin, datasource="tasks", **options)


def test_the_typed_read_gives_the_declared_defaults():
    options = JsonlOptions.of(another_source())
    assert options == JsonlOptions.defaults()
    assert options.prompt_data is None and options.eval_prompt_data is None and options.num_epochs is None
    assert options.keys == Keys(input="prompt", label="label", metadata="metadata")
    assert options.apply_chat_template is False and options.rollout_shuffle is False


def test_paths_are_read_as_paths_and_keys_as_given():
    options = JsonlOptions.of(another_source(prompt_data="data/train.jsonl", input_key="question",
                                             label_key="answer", metadata_key="info"))
    assert options.prompt_data == Path("data/train.jsonl")
    assert options.keys == Keys(input="question", label="answer", metadata="info")


@pytest.mark.parametrize(("bad", "message"), [
    ({"num_epochs": 0}, "--num-epochs 0: must be >= 1"),
    ({"max_image_pixels": 0}, "--max-image-pixels 0: must be >= 1"),
    ({"num_epochs": 1.5}, "--num-epochs: expected int, got 1.5"),
    ({"rollout_shuffle": "yes"}, "--rollout-shuffle: expected true or false, got 'yes'"),
])
def test_a_bad_value_is_a_one_line_usage_error_naming_its_flag(bad, message):
    with pytest.raises(UsageError) as raised:
        another_source(**bad)
    assert str(raised.value) == message


def test_the_source_lists_the_options_it_reads():
    assert JsonlOptions in JsonlSource.option_classes
