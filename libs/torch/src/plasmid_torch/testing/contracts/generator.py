"""The contract every rollout engine (registered with ``plasmid_generators``) must meet.

Subclass it in the engine plugin's tests, naming the plugin module and the provider::

    from plasmid.testing import GeneratorContract

    class TestMyEngine(GeneratorContract):
        plugin = my_engine.plugin          # the module with the hookimpls
        provider = "my-engine"             # the registered engine name
        config_options = {"my_engine_mem_fraction": 0.5}
        logprob_atol = 1e-3                # bf16 engines agree less closely with float32

The suite builds a tiny Hugging Face model (:func:`plasmid_torch.tiny.build_tiny_model`) in a
temporary directory and an engine on it for each test through the ``engine_factory`` fixture;
override that fixture when an engine is built differently (a server to start, a device to pick).
It checks only what :class:`plasmid.protocols.RolloutEngine` promises: responses within the
sampling limits with aligned log-probs, stop tokens, seeds, ``response_logprobs`` agreeing with ``generate``
and with a plain forward pass of the same weights, weight updates served and read back bit for
bit, ``abort_all``, and (an engine that has the optional ``generate_many``) many requests in one
call answered as the same requests one by one. Imports torch and transformers (a reference model runs in-process).

Images (opt-in): an engine that takes prompts with images claims it with ``multimodal = True``. It must
then serve a vision-language model (here the tiny Qwen2-VL of :func:`plasmid_torch.tiny_vision.build_tiny_vlm`)
with what the ``vision`` generate function, the agent gateway and multi-turn tools call: ``images`` (a
sample -> the engine's own form of its images, rebuilt from ``metadata[VISION_KEY]``: torchgen's
:class:`plasmid_torch.vision.VisionInputs`, data URLs for a server) and ``async
generate_with_images(prompt_ids, images, params) -> GenerationOutput`` taking that form. Checked: a response within the
limits with one log-prob per token, equal to a float32 forward pass with the same images (within
``logprob_atol``), reproducible by seed; and another image changes the output distribution (the
log-probs are not those of the other image's forward pass, and greedy answers or their log-probs differ).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from plasmid.protocols import RolloutEngine
from plasmid.testing import build, make_config, run
from plasmid.types import GenerationOutput, SamplingParams, Status
from plasmid_torch.hf import load_causal_lm
from plasmid_torch.ops import logprobs_from_logits
from plasmid_torch.testing.images import BLUE, RED, image_samples
from plasmid_torch.tiny import BOS_ID, EOS_ID, build_tiny_model
from plasmid_torch.vision import ImageInputs, VisionInputs, forward_inputs

#: Prompts of different lengths (token ids of the tiny model's alphabet after ``<bos>``).
PROMPTS = [[BOS_ID, 4, 5, 14, 6, 15], [BOS_ID, 7], [BOS_ID, 3, 3, 3, 3, 3, 3, 3, 3, 3, 9], [BOS_ID, 12, 8, 15]]


class GeneratorContract:
    """Checks of a rollout engine; see the module docstring for how to use it."""

    #: the plugin module (or object) that registers the engine.
    plugin: Any = None
    #: the engine's registered name.
    provider: str = ""
    #: option values (Python names) for the engine's configuration, on top of the defaults.
    config_options: dict[str, Any] = {}
    #: how far ``response_logprobs`` may be from ``generate``'s log-probs and from a float32 forward pass.
    logprob_atol: float = 1e-5
    #: ``max_new_tokens`` of the generation that ``abort_all`` interrupts (must outlast 0.3 s).
    long_generation_tokens: int = 3000
    #: whether the engine takes prompts with images (module docs); the image checks skip otherwise
    multimodal: bool = False

    # ------------------------------------------------------------------------------------------
    # Fixtures (override engine_factory to build the engine another way)
    # ------------------------------------------------------------------------------------------

    @pytest.fixture(scope="class")
    @classmethod
    def model_dir(cls, tmp_path_factory: pytest.TempPathFactory) -> Path:
        """A tiny Qwen2-architecture model (vocabulary 16) whose context fits a long generation."""
        return build_tiny_model(tmp_path_factory.mktemp("generator-contract") / "model", seed=0,
                                max_positions=4096)

    @pytest.fixture
    def engine_factory(self, tmp_path: Path) -> Iterator[Callable[..., RolloutEngine]]:
        """``engine_factory(model_dir, **options)``: an engine serving ``model_dir``, built through
        the registry from ``plugin``; every engine built is shut down after the test."""
        built: list[RolloutEngine] = []

        def factory(model_dir: str | Path, **options: Any) -> RolloutEngine:
            config = make_config(self.plugin, run_dir=tmp_path / "run", model=str(model_dir),
                                 **{**self.config_options, **options})
            engine: RolloutEngine = build("engine", self.provider, self.plugin, config=config)
            built.append(engine)
            return engine

        yield factory
        for engine in built:
            run(engine.shutdown())

    @pytest.fixture
    def engine(self, engine_factory: Callable[..., RolloutEngine], model_dir: Path) -> RolloutEngine:
        return engine_factory(model_dir)

    @pytest.fixture
    def reference_model(self, model_dir: Path) -> Any:
        """The same weights in plain transformers (float32, CPU): what the engine must serve."""
        return load_causal_lm(str(model_dir))

    # ------------------------------------------------------------------------------------------
    # Helpers
    # ------------------------------------------------------------------------------------------

    def check_output(self, output: GenerationOutput, params: SamplingParams, vocab_size: int) -> None:
        assert isinstance(output, GenerationOutput)
        assert 1 <= len(output.token_ids) <= params.max_new_tokens
        assert len(output.logprobs) == len(output.token_ids), "one log-prob per generated token"
        assert all(0 <= t < vocab_size for t in output.token_ids)
        assert all(math.isfinite(lp) and lp <= self.logprob_atol for lp in output.logprobs), "log-probs are <= 0"
        assert output.status in (Status.COMPLETED, Status.TRUNCATED)
        if output.status is Status.COMPLETED:
            assert output.token_ids[-1] in params.stop_token_ids, "COMPLETED means it ended on a stop token"
        else:
            assert len(output.token_ids) == params.max_new_tokens, "TRUNCATED means it hit max_new_tokens"

    @staticmethod
    def reference_logprobs(model: Any, token_ids: list[int], prompt_length: int, temperature: float) -> list[float]:
        with torch.inference_mode():
            input_ids = torch.tensor([token_ids])
            logits = model(input_ids=input_ids).logits[0, prompt_length - 1:-1]
            logprobs: list[float] = logprobs_from_logits(logits, input_ids[0, prompt_length:], temperature).tolist()
            return logprobs

    # ------------------------------------------------------------------------------------------
    # The contract
    # ------------------------------------------------------------------------------------------

    def test_engine_is_a_rollout_engine_at_weight_version_zero(self, engine: RolloutEngine) -> None:
        assert isinstance(engine, RolloutEngine)
        assert engine.weight_version == 0

    def test_response_without_stop_tokens_runs_to_max_new_tokens_and_is_truncated(self, engine: RolloutEngine,
                                                                                   reference_model: Any) -> None:
        params = SamplingParams(temperature=1.0, max_new_tokens=7, seed=1)
        output = run(engine.generate(PROMPTS[0], params))
        self.check_output(output, params, reference_model.config.vocab_size)
        assert output.status is Status.TRUNCATED and len(output.token_ids) == 7
        assert output.weight_version == 0

    def test_stop_token_ends_the_response_and_is_kept(self, engine: RolloutEngine) -> None:
        greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
        free_run = run(engine.generate(PROMPTS[0], greedy)).token_ids
        stop = free_run[3]
        first = free_run.index(stop)
        params = SamplingParams(temperature=0.0, max_new_tokens=8, stop_token_ids=(stop,))
        output = run(engine.generate(PROMPTS[0], params))
        assert output.token_ids == free_run[:first + 1]
        assert output.status is Status.COMPLETED

    def test_greedy_decoding_is_reproducible(self, engine: RolloutEngine) -> None:
        params = SamplingParams(temperature=0.0, max_new_tokens=10)
        first, second = run(engine.generate(PROMPTS[2], params)), run(engine.generate(PROMPTS[2], params))
        assert first.token_ids == second.token_ids

    def test_same_seed_gives_the_same_response_and_other_seeds_differ(self, engine: RolloutEngine) -> None:
        def sample(seed: int) -> GenerationOutput:
            return run(engine.generate(PROMPTS[1], SamplingParams(temperature=1.0, max_new_tokens=16, seed=seed)))

        assert sample(7).token_ids == sample(7).token_ids
        assert len({tuple(sample(seed).token_ids) for seed in (1, 2, 3)}) > 1

    def test_many_concurrent_requests_all_complete_within_their_limits(self, engine: RolloutEngine,
                                                                        reference_model: Any) -> None:
        requests = [(PROMPTS[i % len(PROMPTS)],
                     SamplingParams(temperature=[0.0, 0.7, 1.0][i % 3], top_p=[1.0, 0.9][i % 2],
                                    top_k=[0, 5, 1][i % 3], max_new_tokens=1 + i % 9, stop_token_ids=(2,)))
                    for i in range(48)]

        async def scenario() -> list[GenerationOutput]:
            return await asyncio.gather(*(engine.generate(prompt, params) for prompt, params in requests))

        outputs = run(scenario())
        assert len(outputs) == len(requests)
        for output, (_, params) in zip(outputs, requests, strict=True):
            self.check_output(output, params, reference_model.config.vocab_size)

    def test_generate_many_answers_as_generate_calls_do(self, engine: RolloutEngine) -> None:
        if not callable(getattr(engine, "generate_many", None)):
            pytest.skip(f"{self.provider} has no generate_many (optional: plasmid.protocols.RolloutEngine)")
        requests = [(PROMPTS[i % len(PROMPTS)],
                     SamplingParams(temperature=[0.0, 1.0][i % 2], max_new_tokens=2 + i, seed=20 + i,
                                    stop_token_ids=(2,))) for i in range(6)]
        alone = [run(engine.generate(prompt, params)) for prompt, params in requests]
        together = run(engine.generate_many([p for p, _ in requests], [params for _, params in requests]))  # type: ignore[attr-defined]
        assert [(o.token_ids, o.status) for o in together] == [(o.token_ids, o.status) for o in alone], \
            "generate_many answers in order, as the same requests one by one"
        np.testing.assert_allclose([lp for o in together for lp in o.logprobs],
                                   [lp for o in alone for lp in o.logprobs], rtol=0, atol=self.logprob_atol)

    @pytest.mark.parametrize("temperature", [1.0, 0.7])
    def test_score_returns_the_logprobs_generate_reported(self, engine: RolloutEngine, temperature: float) -> None:
        params = SamplingParams(temperature=temperature, max_new_tokens=12, seed=3)

        async def scenario() -> tuple[GenerationOutput, list[float]]:
            output = await engine.generate(PROMPTS[0], params)
            scored = await engine.response_logprobs(PROMPTS[0] + output.token_ids, len(PROMPTS[0]), temperature)
            return output, scored

        output, scored = run(scenario())
        assert len(scored) == len(output.token_ids)
        np.testing.assert_allclose(scored, output.logprobs, rtol=0, atol=self.logprob_atol)

    def test_greedy_logprobs_are_reported_at_temperature_one(self, engine: RolloutEngine) -> None:
        async def scenario() -> tuple[GenerationOutput, list[float]]:
            output = await engine.generate(PROMPTS[3], SamplingParams(temperature=0.0, max_new_tokens=6))
            return output, await engine.response_logprobs(PROMPTS[3] + output.token_ids, len(PROMPTS[3]), 1.0)

        output, scored = run(scenario())
        np.testing.assert_allclose(scored, output.logprobs, rtol=0, atol=self.logprob_atol)

    def test_score_matches_a_forward_pass_of_the_same_weights(self, engine: RolloutEngine,
                                                             reference_model: Any) -> None:
        tokens = PROMPTS[2] + [5, 9, 2, 14, 3]
        scored = run(engine.response_logprobs(tokens, len(PROMPTS[2]), 0.8))
        expected = self.reference_logprobs(reference_model, tokens, len(PROMPTS[2]), 0.8)
        np.testing.assert_allclose(scored, expected, rtol=0, atol=self.logprob_atol)

    def test_updated_weights_read_back_bit_for_bit_and_set_the_version(self, engine: RolloutEngine,
                                                                        reference_model: Any) -> None:
        state = reference_model.state_dict()
        generator = torch.Generator().manual_seed(0)
        as_torch = "model.layers.0.self_attn.q_proj.weight"
        as_numpy = "model.norm.weight"
        new_torch = state[as_torch] + 0.01 * torch.randn(state[as_torch].shape, generator=generator)
        new_numpy = (state[as_numpy] * 1.5).numpy()

        async def scenario() -> tuple[dict[str, Any], GenerationOutput]:
            await engine.update_weights([(as_torch, new_torch), (as_numpy, new_numpy)], weight_version=3)
            served = await engine.get_weights([as_torch, as_numpy])
            output = await engine.generate(PROMPTS[1], SamplingParams(max_new_tokens=2))
            return served, output

        served, output = run(scenario())
        assert engine.weight_version == 3
        assert output.weight_version == 3
        np.testing.assert_array_equal(np.asarray(served[as_torch]), new_torch.numpy())
        np.testing.assert_array_equal(np.asarray(served[as_numpy]), new_numpy)

    def test_updated_weights_are_the_ones_served(self, engine: RolloutEngine, reference_model: Any) -> None:
        tokens = PROMPTS[0] + [9, 9, 4, 7]
        before = run(engine.response_logprobs(tokens, len(PROMPTS[0]), 1.0))
        name = "model.layers.1.mlp.down_proj.weight"
        parameter = reference_model.state_dict(keep_vars=True)[name]
        with torch.no_grad():
            parameter.mul_(-3.0)
        run(engine.update_weights([(name, parameter.detach().clone())], weight_version=1))
        after = run(engine.response_logprobs(tokens, len(PROMPTS[0]), 1.0))
        expected = self.reference_logprobs(reference_model, tokens, len(PROMPTS[0]), 1.0)
        np.testing.assert_allclose(after, expected, rtol=0, atol=self.logprob_atol)
        assert not np.allclose(before, after, rtol=0, atol=1e-4), "the update changed nothing the engine serves"

    def test_unknown_weight_name_is_an_error_that_names_it(self, engine: RolloutEngine) -> None:
        with pytest.raises(Exception, match="model.layers.0.no_such_proj.weight"):
            run(engine.update_weights([("model.layers.0.no_such_proj.weight", np.zeros(3, np.float32))], 1))

    def test_abort_all_ends_in_flight_requests_promptly_with_aborted(self, engine: RolloutEngine) -> None:
        params = SamplingParams(temperature=1.0, max_new_tokens=self.long_generation_tokens)

        async def scenario() -> tuple[int, GenerationOutput, float]:
            long_request = asyncio.ensure_future(engine.generate(PROMPTS[1], params))
            await asyncio.sleep(0.3)
            assert not long_request.done(), "raise long_generation_tokens: the generation ended before the abort"
            started = time.perf_counter()
            aborted = await engine.abort_all()
            output = await asyncio.wait_for(long_request, timeout=5)
            return aborted, output, time.perf_counter() - started

        aborted, output, seconds = run(scenario())
        assert aborted == 1
        assert output.status is Status.ABORTED
        assert len(output.token_ids) < params.max_new_tokens
        assert len(output.logprobs) == len(output.token_ids)
        assert seconds < 2.0

    def test_engine_serves_again_after_abort_all(self, engine: RolloutEngine) -> None:
        async def scenario() -> tuple[int, GenerationOutput]:
            idle = await engine.abort_all()
            output = await engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=3))
            return idle, output

        idle, output = run(scenario())
        assert idle == 0
        assert output.status is Status.TRUNCATED and len(output.token_ids) == 3

    def test_cache_and_memory_calls_leave_the_engine_serving(self, engine: RolloutEngine) -> None:
        params = SamplingParams(temperature=0.0, max_new_tokens=5)

        async def scenario() -> tuple[GenerationOutput, GenerationOutput]:
            before = await engine.generate(PROMPTS[3], params)
            await engine.flush_cache()
            await engine.release_memory()
            await engine.resume_memory()
            after = await engine.generate(PROMPTS[3], params)
            return before, after

        before, after = run(scenario())
        assert after.token_ids == before.token_ids

    # ------------------------------------------------------------------------------------------
    # Images (opt-in: multimodal = True)
    # ------------------------------------------------------------------------------------------

    @pytest.fixture(scope="class")
    @classmethod
    def vlm_dir(cls, tmp_path_factory: pytest.TempPathFactory) -> Path:
        """The tiny Qwen2-VL (32x32 images are 4 image tokens); skips the test unless :attr:`multimodal`."""
        if not cls.multimodal:
            pytest.skip("set multimodal = True to claim prompts with images")
        from plasmid_torch.tiny_vision import build_tiny_vlm

        return build_tiny_vlm(tmp_path_factory.mktemp("generator-contract") / "vlm", seed=0)

    @pytest.fixture(scope="class")
    @classmethod
    def vlm_reference(cls, vlm_dir: Path) -> Any:
        """The tiny VLM's weights in plain transformers (float32, CPU)."""
        return load_causal_lm(str(vlm_dir))

    @pytest.fixture
    def vlm_engine(self, vlm_dir: Path, engine_factory: Callable[..., RolloutEngine]) -> RolloutEngine:
        """An engine serving the tiny VLM (``vlm_dir`` first: an engine that does not claim images is not built)."""
        engine = engine_factory(vlm_dir)
        assert callable(getattr(engine, "generate_with_images", None)) and getattr(engine, "images", None), \
            f"{self.provider} claims images but has no generate_with_images and images (module docs)"
        return engine

    @staticmethod
    def reference_image_logprobs(model: Any, images: VisionInputs | None, token_ids: list[int], prompt_length: int,
                                 temperature: float) -> list[float]:
        """The log-probs of ``token_ids[prompt_length:]`` in one forward pass of ``model`` with ``images``."""
        with torch.inference_mode():
            input_ids = torch.tensor([token_ids])
            logits = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                           **forward_inputs(model, input_ids, [images])).logits[0, prompt_length - 1:-1]
            logprobs: list[float] = logprobs_from_logits(logits, input_ids[0, prompt_length:], temperature).tolist()
            return logprobs

    def generate_with_images(self, engine: Any, sample: Any, params: SamplingParams) -> GenerationOutput:
        output: GenerationOutput = run(engine.generate_with_images(list(sample.tokens), engine.images(sample),
                                                                   params))
        return output

    def test_a_prompt_with_images_is_answered_with_the_logprobs_of_a_forward_pass_with_them(
            self, vlm_dir: Path, vlm_engine: Any, vlm_reference: Any) -> None:
        (sample,) = image_samples(vlm_dir, [RED])
        params = SamplingParams(temperature=1.0, max_new_tokens=6, seed=1, stop_token_ids=(EOS_ID,))
        output = self.generate_with_images(vlm_engine, sample, params)
        self.check_output(output, params, vlm_reference.config.get_text_config().vocab_size)
        assert output.weight_version == 0
        expected = self.reference_image_logprobs(vlm_reference, ImageInputs(str(vlm_dir))(sample),
                                                 sample.tokens + output.token_ids, len(sample.tokens), 1.0)
        np.testing.assert_allclose(output.logprobs, expected, rtol=0, atol=self.logprob_atol)
        assert self.generate_with_images(vlm_engine, sample, params).token_ids == output.token_ids, \
            "the same seed gives the same response"

    def test_another_image_changes_the_output_distribution(self, vlm_dir: Path, vlm_engine: Any,
                                                           vlm_reference: Any) -> None:
        red, blue = image_samples(vlm_dir, [RED, BLUE])
        assert red.tokens == blue.tokens, "the two prompts differ only in their image"
        greedy = SamplingParams(temperature=0.0, max_new_tokens=6)
        on_red, on_blue = (self.generate_with_images(vlm_engine, sample, greedy) for sample in (red, blue))
        assert on_red.token_ids != on_blue.token_ids or not np.allclose(on_red.logprobs, on_blue.logprobs,
                                                                        rtol=0, atol=1e-3), \
            "a red and a blue image give the same answer with the same log-probs: are the images used?"
        under_blue = self.reference_image_logprobs(vlm_reference, ImageInputs(str(vlm_dir))(blue),
                                                   red.tokens + on_red.token_ids, len(red.tokens), 1.0)
        assert not np.allclose(on_red.logprobs, under_blue, rtol=0, atol=1e-3), \
            "the answer to the red image has the log-probs it would have with the blue one"
