"""The prompt encoder of the data sources over prompt files refuses text its tokenizer cannot
encode, naming the character: whether the tokenizer raises (the tiny char tokenizer) or maps the
character to its unknown token; and it says when a chat template goes unused."""

from __future__ import annotations

import json

import pytest

from plasmid.errors import UsageError
from plasmid_torch.prompts import PromptEncoder
from plasmid_torch.tiny import build_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", hidden_size=16, num_layers=1,
                                num_heads=2))


@pytest.fixture(scope="module")
def with_unknown_token(tmp_path_factory):
    """A model directory whose word-level tokenizer maps unknown characters to ``[UNK]``."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "<eos>": 1, **{char: 2 + i for i, char in enumerate("0123456789+=")}}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]", eos_token="<eos>")
    directory = tmp_path_factory.mktemp("models") / "unk"
    tokenizer.save_pretrained(directory)
    (directory / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": len(vocab)}))
    return str(directory)


def test_a_character_the_tokenizer_raises_on_is_named(tiny):
    encoder = PromptEncoder(tiny, chat=False)
    assert encoder("1+2=") == [1, 4, 13, 5, 14]
    with pytest.raises(UsageError) as raised:
        encoder("1+x=")
    assert str(raised.value) == ("the tokenizer cannot encode the character 'x' (U+0078) of the prompt (Exception: "
                                 "WordLevel error: Missing [UNK] token from the vocabulary); remove it from the data "
                                 "or use a model whose tokenizer has it")


def test_in_chat_mode_the_character_of_a_message_is_named(tiny):
    encoder = PromptEncoder(tiny, chat=True)
    with pytest.raises(UsageError, match=r"^the tokenizer cannot encode the character 'é' \(U\+00E9\)"):
        encoder(encoder.check([{"role": "user", "content": "1+é="}], "rows.jsonl:1"))


def test_a_character_mapped_to_the_unknown_token_is_named(with_unknown_token):
    encoder = PromptEncoder(with_unknown_token, chat=False)
    assert encoder("1+2=") == [3, 12, 4, 13]
    with pytest.raises(UsageError) as raised:
        encoder("1+2=?")
    assert str(raised.value).startswith("the tokenizer cannot encode the character '?' (U+003F) of the prompt (it "
                                        "gave its unknown token '[UNK]')")
    assert encoder("1[UNK]") == [3, 0], "text that spells the unknown token is taken as it is"


def test_an_unused_chat_template_is_reported_with_the_flag_that_applies_it(tiny, with_unknown_token):
    assert PromptEncoder(tiny, chat=False, flag="--hf-apply-chat-template").chat_template_flag == (
        "--hf-apply-chat-template")
    assert PromptEncoder(tiny, chat=True).chat_template_flag == ""
    assert PromptEncoder(with_unknown_token, chat=False).chat_template_flag == ""  # no template to apply
    with pytest.raises(UsageError, match="^--hf-apply-chat-template: the tokenizer of --model .* has no chat template"):
        PromptEncoder(with_unknown_token, chat=True, flag="--hf-apply-chat-template")
