"""A request past ``max_model_len``: vLLM refuses it with HTTP 400 ("This model's maximum context
length is N tokens ..."); the engine raises that as a ContextLengthError naming both lengths,
without retrying. The answer's reading is checked with a stand-in HTTP session; the last test
asks the session's real server (max_model_len 1024 on the CPU)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from plasmid_vllm.engine import VLLMEngine

from plasmid.errors import ContextLengthError, ProviderError
from plasmid.testing import run
from plasmid.types import SamplingParams

#: What vLLM's OpenAI server answers (0.9 on; older versions say "However, you requested ...").
REFUSAL = json.dumps({"error": {"message": (
    "'max_tokens' or 'max_completion_tokens' is too large: 2000. This model's maximum context length is 1024 tokens "
    "and your request has 2 input tokens (2000 > 1024 - 2). None"), "type": "BadRequestError", "param": None,
    "code": 400}})


class Answer:
    def __init__(self, status: int, text: str) -> None:
        self.status, self._text = status, text

    async def text(self) -> str:
        return self._text

    async def __aenter__(self) -> Answer:
        return self

    async def __aexit__(self, *exc) -> None:
        return None


class Session:
    def __init__(self, status: int, text: str) -> None:
        self.answer = Answer(status, text)

    def post(self, url: str, json: dict) -> Answer:
        return self.answer


def read(status: int, text: str):
    body = {"prompt": [1, 4], "max_tokens": 2000}
    server = SimpleNamespace(url="http://127.0.0.1:8000", name="server 0 (127.0.0.1:8000)")
    engine = SimpleNamespace(names=VLLMEngine.names)     # _read reads nothing else of the engine
    return run(VLLMEngine._read(engine, Session(status, text), server, body, [], []))


def test_a_refusal_for_length_is_a_context_length_error_naming_both_lengths():
    with pytest.raises(ContextLengthError) as raised:
        read(400, REFUSAL)
    assert str(raised.value) == (
        "vllm generate: server 0 (127.0.0.1:8000): This model's maximum context length is 1024 tokens. However, you "
        "requested 2002 tokens (2 in the messages, 2000 in the completion). Please reduce the length of the messages "
        "or completion.")


def test_other_refusals_stay_provider_errors():
    with pytest.raises(ProviderError, match="answered HTTP 400: .*unknown model"):
        read(400, '{"error": {"message": "unknown model plasmid-v3"}}')


def test_the_real_server_refuses_a_request_past_max_model_len(engine):
    with pytest.raises(ContextLengthError) as raised:
        run(engine.generate([1, 4], SamplingParams(max_new_tokens=2000)))
    assert (raised.value.context, raised.value.prompt_tokens, raised.value.completion_tokens) == (1024, 2, 2000)
