"""--apply-chat-template: messages (or a string as one user message) through the chat template."""

import pytest
from plasmid_jsonl import plugin

from plasmid.errors import UsageError
from plasmid.testing import build
from plasmid_torch.hf import load_tokenizer


def jsonl_source(config):
    return build("datasource", "jsonl", plugin, config=config)


def test_messages_are_encoded_with_the_template_and_a_generation_prompt(jsonl_config, chat_model, write_jsonl):
    rows = [{"prompt": [{"role": "system", "content": "add"}, {"role": "user", "content": "1+2="}]},
            {"prompt": "3+4="}]
    source = jsonl_source(jsonl_config(model=chat_model, apply_chat_template=True,
                                       prompt_data=write_jsonl("chat.jsonl", rows)))
    first, second = (group.samples[0] for group in source.get_groups(2))
    tokenizer = load_tokenizer(chat_model)
    assert first.prompt == rows[0]["prompt"]
    assert tokenizer.decode(first.tokens) == "system:add|user:1+2=|assistant:"
    assert second.prompt == [{"role": "user", "content": "3+4="}], "a string is one user message"
    assert tokenizer.decode(second.tokens) == "user:3+4=|assistant:"


def test_chat_prompts_in_parquet_round_trip(jsonl_config, chat_model, write_parquet):
    rows = [{"prompt": [{"role": "user", "content": "5+5="}], "label": "0"}]
    source = jsonl_source(jsonl_config(model=chat_model, apply_chat_template=True,
                                       prompt_data=write_parquet("chat.parquet", rows)))
    sample = source.get_groups(1)[0].samples[0]
    assert (sample.prompt, sample.label) == (rows[0]["prompt"], "0")
    assert load_tokenizer(chat_model).decode(sample.tokens) == "user:5+5=|assistant:"


def test_malformed_messages_are_reported_with_their_line(jsonl_config, chat_model, write_jsonl):
    path = write_jsonl("bad.jsonl", [{"prompt": "1+1="}, {"prompt": [{"role": "user"}]}])
    with pytest.raises(UsageError, match=rf"{path}:2: with --apply-chat-template the prompt must be"):
        jsonl_source(jsonl_config(model=chat_model, apply_chat_template=True, prompt_data=path))


def test_a_tokenizer_without_chat_template_is_a_usage_error(jsonl_config, tmp_path, example_file):
    from plasmid_torch.tiny import build_tiny_model

    plain = str(build_tiny_model(tmp_path / "plain", chat_template=False))
    with pytest.raises(UsageError, match=rf"the tokenizer of --model {plain} has no chat template"):
        jsonl_source(jsonl_config(model=plain, apply_chat_template=True, prompt_data=example_file))
