"""A request past the model's context: SGLang refuses it with HTTP 400 ("Requested token count
exceeds the model's maximum context length of N tokens ..."); the engine raises that as a
ContextLengthError naming both lengths, at once, without retrying. The answer's reading is
checked without a server; the last test asks a real one."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from plasmid_sglang.engine import SGLangEngine

from plasmid.errors import ContextLengthError, ProviderError
from plasmid.testing import run
from plasmid.types import SamplingParams

#: What SGLang's tokenizer manager answers (sglang 0.4.6 on; the FastAPI error body).
REFUSAL = json.dumps({"error": {"message": (
    "Requested token count exceeds the model's maximum context length of 4096 tokens. You requested a total of "
    "5002 tokens: 2 tokens from the input messages and 5000 tokens for the completion. Please reduce the number of "
    "tokens in the input messages or the completion to fit within the limit.")}})
SERVER = SimpleNamespace(name="server 0 (127.0.0.1:30000)")


def answer(status: int, text: str, prompt_tokens: int = 2, new_tokens: int = 5000):
    return SGLangEngine._generate_answer(SimpleNamespace(router=None), SERVER, status, text, prompt_tokens,
                                         new_tokens)


def test_a_refusal_for_length_is_a_context_length_error_naming_both_lengths():
    with pytest.raises(ContextLengthError) as raised:
        answer(400, REFUSAL)
    assert str(raised.value) == (
        "sglang generate: server 0 (127.0.0.1:30000): This model's maximum context length is 4096 tokens. However, "
        "you requested 5002 tokens (2 in the messages, 5000 in the completion). Please reduce the length of the "
        "messages or completion.")
    with pytest.raises(ContextLengthError, match="maximum context length is 64 tokens"):
        answer(400, '{"error": {"message": "The input (70 tokens) is longer than the model\'s context length '
                    '(64 tokens)."}}', prompt_tokens=70, new_tokens=1)


def test_other_refusals_stay_provider_errors_and_answers_are_read():
    with pytest.raises(ProviderError, match="answered HTTP 400: .*out of vocabulary"):
        answer(400, '{"error": {"message": "token id out of vocabulary"}}')
    with pytest.raises(ProviderError, match="answered HTTP 500"):
        answer(500, REFUSAL)
    assert answer(200, '{"output_ids": [1]}') == {"output_ids": [1]}


def test_a_real_server_refuses_a_request_past_the_context_without_a_retry(engines):
    engine = engines[0]
    retries = engine.stats()["retries"]
    with pytest.raises(ContextLengthError) as raised:
        run(engine.generate([1, 7], SamplingParams(max_new_tokens=5000)))
    assert (raised.value.context, raised.value.prompt_tokens, raised.value.completion_tokens) == (4096, 2, 5000)
    assert engine.stats()["retries"] == retries
