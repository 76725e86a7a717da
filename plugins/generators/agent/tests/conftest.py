"""Fixtures of the agent gateway's tests: a tiny model and its tokenizer, scripted and recording engines."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from plasmid.types import GenerationOutput, SamplingParams, Status

# This directory goes first on sys.path (the tests import `conftest` and the agents of agents.py). Its
# agents.py would then shadow, for the rest of the pytest process, the top-level package `agents` of
# openai-agents, which verifiers imports (verifiers.ToolEnv failed in the environments tests run after
# these): the installed package is imported first, so that the name stays bound to it.
if importlib.util.find_spec("agents") is not None:
    importlib.import_module("agents")
sys.path.insert(0, str(Path(__file__).parent))


class RecordingEngine:
    """Wraps an engine; ``seen`` holds ``(prompt_ids, params, output)`` of every generate call."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.seen: list[tuple[list[int], SamplingParams, GenerationOutput]] = []

    @property
    def weight_version(self) -> int:
        return self.engine.weight_version

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerationOutput:
        output = await self.engine.generate(list(prompt_ids), params)
        self.seen.append((list(prompt_ids), params, output))
        return output

    async def abort_all(self) -> int:
        return await self.engine.abort_all()


class ScriptedEngine:
    """Answers call ``k`` with the ids of ``texts[k]`` (encoded by ``tokenizer``) and log-probs
    ``-0.01 * (k + 1) * (i + 1)``; ``status`` for each, COMPLETED by default."""

    weight_version = 3

    def __init__(self, tokenizer: Any, texts: list[str], statuses: list[Status] | None = None) -> None:
        self.replies = [tokenizer.encode(text, add_special_tokens=False) for text in texts]
        self.statuses = statuses or [Status.COMPLETED] * len(texts)
        self.seen: list[tuple[list[int], SamplingParams]] = []

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerationOutput:
        k = len(self.seen)
        self.seen.append((list(prompt_ids), params))
        ids = self.replies[k][:params.max_new_tokens]
        return GenerationOutput(ids, [-0.01 * (k + 1) * (i + 1) for i in range(len(ids))], self.statuses[k],
                                self.weight_version)

    async def abort_all(self) -> int:
        return 0


def make_ctx(tokenizer: Any, engine: Any, aborting: asyncio.Event | None = None) -> Any:
    """What the agent generate function reads of the rollout context."""
    return SimpleNamespace(tokenizer=tokenizer, engine_for=lambda sample: engine,
                           aborting=aborting if aborting is not None else asyncio.Event())


#: The char alphabet of the tool-call tests (letters, digits and JSON punctuation).
TOOL_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789+-*/=<>{}[]\":,_. \n"
#: A Qwen-like template for it: tool calls rendered as the model writes them.
TOOL_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{% if m['content'] %}{{ m['content'] }}{% endif %}"
    "{% if m['tool_calls'] %}{% for c in m['tool_calls'] %}<tool_call>{\"name\": \"{{ c['function']['name'] }}\", "
    "\"arguments\": {{ c['function']['arguments'] | tojson }}}</tool_call>{% endfor %}{% endif %}"
    "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


@pytest.fixture(scope="session")
def tool_tokenizer():
    from plasmid_torch.tiny import char_tokenizer

    tokenizer = char_tokenizer(TOOL_ALPHABET)
    tokenizer.chat_template = TOOL_TEMPLATE
    return tokenizer


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from plasmid_torch.tiny import char_tokenizer

    return char_tokenizer()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    from plasmid_torch.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("agent") / "model", seed=0)
