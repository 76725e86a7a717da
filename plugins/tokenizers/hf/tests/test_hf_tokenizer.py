"""The ``hf`` tokenizer loads the model directory's tokenizer and names a directory without one."""

from __future__ import annotations

import pytest
from plasmid_hf import plugin
from plasmid_hf.tokenizer import model_tokenizer

from plasmid.errors import UsageError
from plasmid.kernel_options import GeneralOptions
from plasmid.protocols import Tokenizer
from plasmid.testing import build, make_config
from plasmid_torch.tiny import build_tiny_model


def test_hf_tokenizer_round_trips_the_tiny_models_text(tmp_path):
    model_dir = tmp_path / "model"
    build_tiny_model(model_dir, seed=0)
    tokenizer = build("tokenizer", "hf", plugin, config=make_config(plugin, model=str(model_dir)))
    assert isinstance(tokenizer, Tokenizer)
    ids = tokenizer.encode("12+7=", add_special_tokens=False)
    assert tokenizer.decode(ids) == "12+7="
    assert tokenizer.eos_token_id is not None


def test_a_model_directory_without_a_tokenizer_is_a_usage_error_naming_it(tmp_path):
    empty = tmp_path / "weights-only"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    with pytest.raises(UsageError, match="weights-only"):
        build("tokenizer", "hf", plugin, config=make_config(plugin, model=str(empty)))


def test_without_a_model_the_tokenizer_is_a_usage_error_naming_the_flag():
    with pytest.raises(UsageError, match="^tokenizer hf: --model is not set"):
        build("tokenizer", "hf", plugin, config=make_config(plugin))


def test_the_factory_lists_the_options_it_reads():
    assert model_tokenizer.option_classes == (GeneralOptions,)
