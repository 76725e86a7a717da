"""The contract every generate function (registered with ``plasmid_generate_fns``) must meet.

Subclass it in the plugin's tests, naming the plugin module and the provider::

    from plasmid.testing.contracts.generate import GenerateContract

    class TestMyGenerate(GenerateContract):
        plugin = my_package.plugin        # the module with the hookimpls
        provider = "my-generate"          # the registered name
        config_options = {"my_generate_turns": 1}

The generate function runs on a :class:`plasmid.testing.scripted.ScriptedEngine` that answers
every call with :attr:`GenerateContract.reply` (a stop token ends it), with a byte tokenizer
(:class:`ByteTokenizer`) and no tools. What it checks, as :class:`plasmid.protocols.GenerateFn`
promises: every returned sample starts with its prompt's tokens and has ``response_length``,
``loss_mask`` and ``rollout_logprobs`` of one length, a finished status, the engine's
``weight_version``, at least one trained token and a ``response`` string; the first engine call
gets the prompt and at most ``max_new_tokens``; concurrent samples are kept apart; an engine
output ending ``ABORTED`` gives an ``ABORTED`` sample that is still consistent; and a generate
function with the optional ``generate_many`` answers a group as its calls one by one do, on an
engine with ``generate_many`` (one engine call for the group) and on one without. Imports no torch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from plasmid.config import Config
from plasmid.context import RolloutContext
from plasmid.protocols import GenerateFn, RolloutEngine
from plasmid.testing import build, make_config, run
from plasmid.testing.scripted import BatchingScriptedEngine, Reply, ScriptedEngine
from plasmid.types import Sample, SamplingParams, Status

#: The stop token of the contract's sampling parameters.
STOP = 2


class ByteTokenizer:
    """A :class:`plasmid.protocols.Tokenizer` of byte values (id = byte + 3; 0-2 special)."""

    eos_token_id = STOP

    def encode(self, text: str, *args: Any, **kwargs: Any) -> list[int]:
        return [byte + 3 for byte in text.encode()]

    def decode(self, token_ids: Sequence[int], *args: Any, **kwargs: Any) -> str:
        return bytes(token - 3 for token in token_ids if token >= 3).decode(errors="replace")

    def __call__(self, text: str, **kwargs: Any) -> dict[str, list[int]]:
        return {"input_ids": self.encode(text)}


def make_context(config: Config, engine: RolloutEngine, generate: GenerateFn, tokenizer: Any = None) -> RolloutContext:
    """A rollout context of one engine, ``tokenizer`` (default a :class:`ByteTokenizer`), no data
    source, rewards or tools."""
    return RolloutContext(config=config, engines=[engine], data_source=None,  # type: ignore[arg-type]
                          tokenizer=tokenizer if tokenizer is not None else ByteTokenizer(),
                          generate=generate, rewards=None)  # type: ignore[arg-type]


def prompt_sample(text: str, index: int = 0) -> Sample:
    """A pending prompt sample of ``text`` (its tokens: :class:`ByteTokenizer`'s, no response)."""
    return Sample(prompt=text, tokens=ByteTokenizer().encode(text), response_length=0, index=index,
                  group_index=index, status=Status.PENDING)


class GenerateContract:
    """Checks of a generate function; see the module docstring for how to use it."""

    plugin: Any = None
    provider: str = ""
    #: option values (Python names) on top of the defaults.
    config_options: dict[str, Any] = {}
    #: what the scripted engine answers every call with (ends on the stop token).
    reply: tuple[int, ...] = (70, 71, 72, STOP)
    params = SamplingParams(temperature=1.0, max_new_tokens=16, stop_token_ids=(STOP,), seed=0)

    def tokenizer(self) -> Any:
        """The run's tokenizer the generate function gets (default :class:`ByteTokenizer`).
        Override it together with :meth:`prompt` for a generate function that needs its own data
        source's prompts (an environment's, with a label and a chat template)."""
        return ByteTokenizer()

    def prompt(self, text: str, index: int = 0) -> Sample:
        """A pending prompt sample for ``text`` with ``index`` and ``group_index`` ``index``
        (default :func:`prompt_sample`; an override may ignore ``text`` but must keep the indices
        and tokenize with :meth:`tokenizer`)."""
        return prompt_sample(text, index)

    def make(self) -> tuple[Config, GenerateFn]:
        config = make_config(self.plugin, generate=self.provider, **self.config_options)
        return config, build("generate", self.provider, self.plugin, config=config)

    def generate(self, samples: list[Sample], engine: ScriptedEngine) -> list[Sample]:
        config, generate = self.make()
        ctx = make_context(config, engine, generate, self.tokenizer())

        async def scenario() -> list[Any]:
            return list(await asyncio.gather(*(generate(ctx, sample, self.params) for sample in samples)))

        done: list[Sample] = []
        for result in run(scenario()):
            done.extend(result if isinstance(result, list) else [result])
        return done

    def check(self, sample: Sample, prompt_tokens: list[int]) -> None:
        assert isinstance(sample, Sample)
        assert sample.tokens[:len(prompt_tokens)] == prompt_tokens, "the response follows the prompt's tokens"
        assert sample.response_length == len(sample.tokens) - len(prompt_tokens)
        assert sample.loss_mask is not None and len(sample.loss_mask) == sample.response_length
        assert set(sample.loss_mask) <= {0, 1}
        assert sample.rollout_logprobs is not None and len(sample.rollout_logprobs) == sample.response_length
        assert isinstance(sample.response, str)

    def test_a_prompt_becomes_a_finished_consistent_sample(self) -> None:
        engine = ScriptedEngine(lambda ids, params: Reply(list(self.reply)), weight_version=3)
        prompt = self.prompt("2+2=")
        tokens = list(prompt.tokens)
        (sample,) = self.generate([prompt], engine)[:1]
        self.check(sample, tokens)
        assert sample.status in (Status.COMPLETED, Status.TRUNCATED)
        assert sample.weight_version == 3, "weight_version is the engine output's"
        assert sum(sample.loss_mask or []) >= 1, "the policy's tokens are trained on"
        assert engine.calls and engine.calls[0].prompt_ids == tokens, "the first engine call gets the prompt"
        assert all(call.params.max_new_tokens <= self.params.max_new_tokens for call in engine.calls)

    def test_a_length_limit_gives_a_truncated_sample(self) -> None:
        engine = ScriptedEngine(lambda ids, params: Reply([70] * 40))
        prompt = self.prompt("count:")
        tokens = list(prompt.tokens)
        (sample,) = self.generate([prompt], engine)[:1]
        self.check(sample, tokens)
        assert sample.status is Status.TRUNCATED

    def test_concurrent_samples_are_kept_apart(self) -> None:
        def reply(ids: list[int], params: SamplingParams) -> Reply:
            return Reply([ids[-1], ids[-1], STOP])     # echoes the prompt's last token

        prompts = [self.prompt(f"q{i}", index=i) for i in range(6)]
        tokens = [list(p.tokens) for p in prompts]
        done = self.generate(prompts, ScriptedEngine(reply))
        assert len(done) >= len(prompts)
        for sample in done:
            self.check(sample, tokens[sample.index])
            assert sample.tokens[len(tokens[sample.index])] == tokens[sample.index][-1]

    def test_generate_many_answers_as_calls_one_by_one_do(self) -> None:
        config, generate = self.make()
        if not callable(getattr(generate, "generate_many", None)):
            pytest.skip(f"{self.provider} has no generate_many (optional: plasmid.protocols.GenerateFn)")

        def reply(ids: list[int], params: SamplingParams) -> Reply:
            return Reply([ids[-1], 70 + len(ids) % 5, STOP])

        def prompts() -> list[Sample]:
            return [self.prompt(f"q{i}{'x' * i}", index=i) for i in range(5)]

        one_by_one = self.generate(prompts(), ScriptedEngine(reply, weight_version=2))
        for engine in (ScriptedEngine(reply, weight_version=2), BatchingScriptedEngine(reply, weight_version=2)):
            ctx = make_context(config, engine, generate, self.tokenizer())
            done: list[Sample] = []
            for result in run(generate.generate_many(ctx, prompts(), [self.params] * 5)):  # type: ignore[attr-defined]
                done.extend(result if isinstance(result, list) else [result])
            assert [(s.index, s.tokens, s.response, s.loss_mask, s.rollout_logprobs, s.status, s.weight_version)
                    for s in done] == [(s.index, s.tokens, s.response, s.loss_mask, s.rollout_logprobs, s.status,
                                        s.weight_version) for s in one_by_one], \
                f"generate_many on {type(engine).__name__} differs from calls one by one"
            if isinstance(engine, BatchingScriptedEngine):
                assert engine.batches and sum(engine.batches) == len(engine.calls), \
                    "an engine with generate_many gets the group's requests through it"

    def test_an_aborted_engine_output_gives_an_aborted_consistent_sample(self) -> None:
        engine = ScriptedEngine(lambda ids, params: Reply([70, 71], status=Status.ABORTED))
        prompt = self.prompt("slow")
        tokens = list(prompt.tokens)
        (sample,) = self.generate([prompt], engine)[:1]
        self.check(sample, tokens)
        assert sample.status is Status.ABORTED


__all__ = ["ByteTokenizer", "GenerateContract", "make_context", "prompt_sample"]
