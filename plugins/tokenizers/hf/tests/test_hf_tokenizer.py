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


#: Every printable ASCII character plus tab and newline: the alphabet of the environment recipes'
#: tiny models (reasoning-gym, verifiers, gym), whose prompts are full of spaces and newlines.
PRINTABLE = "\t\n" + "".join(chr(code) for code in range(32, 127))


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_a_saved_char_tokenizer_keeps_every_character_whatever_the_model_type(tmp_path, arch):
    # transformers 5 loads a qwen2 directory's tokenizer as Qwen2Tokenizer whatever class was saved;
    # its byte-level pre-tokenizer dropped every space and newline of the char vocabulary
    from plasmid_torch.hf import load_tokenizer
    from plasmid_torch.tiny import char_tokenizer

    model = build_tiny_model(tmp_path / "m", alphabet=PRINTABLE, arch=arch, hidden_size=32, num_layers=1, num_heads=2)
    text = "Calculate ( 241 - -8540 ).\n\tok\n\n\n  yes"
    expected = char_tokenizer(PRINTABLE).encode(text)
    assert len(expected) == 1 + len(text), "one id per character after <bos>, newlines in a row too"
    plugin_tokenizer = build("tokenizer", "hf", plugin, config=make_config(plugin, model=str(model)))
    assert plugin_tokenizer.encode(text) == expected
    assert load_tokenizer(str(model)).encode(text) == expected
    assert plugin_tokenizer.decode(expected, skip_special_tokens=True) == text and plugin_tokenizer.chat_template


def test_the_tokenizer_lists_every_end_of_sequence_id_of_the_model(tmp_path):
    # Llama 3 style: config.json and generation_config.json list several EOS ids (eot, end of text, ...)
    import json

    from plasmid.protocols import SupportsEosIds

    model_dir = build_tiny_model(tmp_path / "model", seed=0, hidden_size=16, num_layers=1, num_heads=2)
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "eos_token_id": [2, 5]}))
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 2, 9], "bos_token_id": 1}))
    tokenizer = build("tokenizer", "hf", plugin, config=make_config(plugin, model=str(model_dir)))
    assert isinstance(tokenizer, SupportsEosIds)
    assert tokenizer.eos_token_id == 2 and tuple(tokenizer.eos_ids) == (2, 5, 7, 9)


def test_without_generation_config_the_eos_ids_are_the_tokenizers(tmp_path):
    model_dir = build_tiny_model(tmp_path / "model", seed=0, hidden_size=16, num_layers=1, num_heads=2)
    (model_dir / "generation_config.json").unlink(missing_ok=True)
    tokenizer = build("tokenizer", "hf", plugin, config=make_config(plugin, model=str(model_dir)))
    assert tuple(tokenizer.eos_ids) == (2,)


def test_a_plain_transformers_tokenizer_is_no_eos_ids_tokenizer():
    # transformers answers `<special token>_ids` attributes itself; `eos_ids` is not one of them
    from plasmid.protocols import SupportsEosIds
    from plasmid_torch.tiny import char_tokenizer

    assert not isinstance(char_tokenizer(), SupportsEosIds)
