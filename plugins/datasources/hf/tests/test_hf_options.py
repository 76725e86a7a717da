"""The hf-datasets options are declared once: a bad value is a one-line error naming its flag,
and the typed read gives the declared defaults."""

import pytest
from plasmid_hf_datasets import plugin
from plasmid_hf_datasets.options import HfDatasetOptions
from plasmid_hf_datasets.source import HfDatasetSource

from plasmid.errors import UsageError
from plasmid.records import Keys
from plasmid.testing import make_config


def another_source(**options):
    """A configuration where ``hf`` is installed but another source is chosen."""
    return make_config(plugin, datasource="tasks", **options)


def test_the_typed_read_gives_the_declared_defaults():
    options = HfDatasetOptions.of(another_source())
    assert options == HfDatasetOptions.defaults()
    assert options.hf_path is None and options.hf_data_files == () and options.hf_split == "train"
    assert options.hf_eval_split is None and options.hf_max_prompt_tokens is None and options.hf_num_epochs is None
    assert options.keys == Keys(input="prompt", label="label", metadata="metadata")
    assert options.hf_apply_chat_template is False and options.hf_shuffle is False


def test_keys_and_data_files_are_read_as_given():
    options = HfDatasetOptions.of(another_source(hf_path="json", hf_data_files=("a.jsonl", "b.jsonl"),
                                                 hf_input_key="question", hf_label_key="reward_model.ground_truth",
                                                 hf_metadata_key="info"))
    assert options.hf_data_files == ("a.jsonl", "b.jsonl")
    assert options.keys == Keys(input="question", label="reward_model.ground_truth", metadata="info")


@pytest.mark.parametrize(("bad", "message"), [
    ({"hf_num_epochs": 0}, "--hf-num-epochs 0: must be >= 1"),
    ({"hf_max_prompt_tokens": 0}, "--hf-max-prompt-tokens 0: must be >= 1"),
    ({"hf_max_image_pixels": 0}, "--hf-max-image-pixels 0: must be >= 1"),
    ({"hf_shuffle": "yes"}, "--hf-shuffle: expected true or false, got 'yes'"),
    ({"hf_data_files": ("a.jsonl",)}, "--hf-data-files needs --hf-path (the builder: json, parquet or csv)"),
])
def test_a_bad_value_is_a_one_line_usage_error_naming_its_flag(bad, message):
    with pytest.raises(UsageError) as raised:
        another_source(**bad)
    assert str(raised.value) == message


@pytest.mark.parametrize(("options", "message"), [
    ({"model": "m"}, "--datasource hf needs --hf-path PATH"),
    ({"hf_path": "x.jsonl"}, "--datasource hf needs --model DIR"),
])
def test_choosing_hf_needs_a_path_and_a_model(options, message):
    with pytest.raises(UsageError, match=f"^{message}"):
        make_config(plugin, datasource="hf", **options)


def test_the_source_lists_the_options_it_reads():
    assert HfDatasetOptions in HfDatasetSource.option_classes
