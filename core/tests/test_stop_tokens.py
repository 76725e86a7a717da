"""The ids that end a response: the tokenizer's end-of-sequence ids (every one it lists, else its
``eos_token_id``), then ``--stop-token-ids``, each once; bad ids are one-line usage errors."""

from __future__ import annotations

import json

import pytest

from plasmid.errors import UsageError
from plasmid.stop_tokens import check_stop_token_ids, stop_token_ids
from plasmid.testing import make_config


class PlainTokenizer:
    """A third-party tokenizer written against the Tokenizer protocol before eos_ids existed."""

    eos_token_id = 2

    def encode(self, text, *args, **kwargs):
        return []

    def decode(self, token_ids, *args, **kwargs):
        return ""


class ListingTokenizer(PlainTokenizer):
    eos_ids = (2, 7, 9)


def test_a_tokenizer_without_eos_ids_stops_on_its_eos_token_id_as_before():
    assert stop_token_ids(make_config(), PlainTokenizer()) == (2,)


def test_every_listed_eos_id_then_the_options_ids_each_once_eos_token_id_first():
    assert stop_token_ids(make_config(), ListingTokenizer()) == (2, 7, 9)
    config = make_config(stop_token_ids=("11,9", "4"))
    assert stop_token_ids(config, ListingTokenizer()) == (2, 7, 9, 11, 4)
    assert stop_token_ids(config, PlainTokenizer()) == (2, 11, 9, 4)


@pytest.mark.parametrize(("value", "message"), [
    ("x", "--stop-token-ids x: 'x' is not a token id (expected non-negative integers, as 1,2,3)"),
    ("-1", "--stop-token-ids -1: '-1' is not a token id (expected non-negative integers, as 1,2,3)"),
    ("1,,2", "--stop-token-ids 1,,2: '' is not a token id (expected non-negative integers, as 1,2,3)"),
    ("3.5", "--stop-token-ids 3.5: '3.5' is not a token id (expected non-negative integers, as 1,2,3)"),
])
def test_a_value_that_is_no_token_id_is_a_one_line_usage_error(value, message):
    with pytest.raises(UsageError) as raised:
        make_config(stop_token_ids=(value,))
    assert str(raised.value) == message


def test_an_id_past_the_models_vocabulary_is_a_one_line_usage_error(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 16, "max_position_embeddings": 64}))
    check_stop_token_ids(make_config(model=str(tmp_path), stop_token_ids=("15",)))
    with pytest.raises(UsageError) as raised:
        check_stop_token_ids(make_config(model=str(tmp_path), stop_token_ids=("3,16",)))
    assert str(raised.value) == (f"--stop-token-ids: 16 is not a token id of the model at {tmp_path}, whose "
                                 f"vocabulary has ids 0..15 (vocab_size in config.json)")
    with pytest.raises(UsageError, match="^--stop-token-ids: 16 is not a token id"):
        stop_token_ids(make_config(model=str(tmp_path), stop_token_ids=("16",)), PlainTokenizer())
