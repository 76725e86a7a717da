"""A tool that answers with an image, in a multi-turn rollout of the tiny vision-language model on the
real torchgen engine, scored again by the real torchtrain trainer: the tool's image tokens are in the
next turn's prompt, loss-masked; the engine generates with them; the trainer, rebuilding the pixels from
the sample's reference, computes the engine's log-probs. And what an image answer the run cannot show
becomes: a one-line tool error."""

from __future__ import annotations

import asyncio
import base64
import io
import re

import plasmid_multiturn.plugin
import pytest

from plasmid import testing
from plasmid.context import RolloutContext
from plasmid.types import Sample, SamplingParams
from plasmid_serving.parsers import TOOL_PARSERS, CallSpan, ToolCall, ToolParser

PIL = pytest.importorskip("PIL.Image")
pytest.importorskip("plasmid_torchgen")
pytest.importorskip("plasmid_torchtrain")

from plasmid_torch.tiny_vision import EOS_ID, IMAGE_PAD_ID, build_tiny_vlm  # noqa: E402 (after the skips)
from plasmid_torch.vision import VISION_KEY, VisionEncoder  # noqa: E402

SQUARE = (30, 180, 30)


class FirstLetterCalls(ToolParser):
    """The first letter of a turn is a call of ``square``: a syntax the untrained tiny VLM writes."""

    name = "tiny-first-letter"

    def spans(self, text, tools=None):
        found = re.search(r"[a-z]", text)
        return [] if found is None else [CallSpan(found.start(), found.end(), (ToolCall("square", {}),))]


if "tiny-first-letter" not in TOOL_PARSERS.names():
    TOOL_PARSERS.register("tiny-first-letter", FirstLetterCalls, origin=__file__)


def png_url(side: int, colour: tuple[int, int, int]) -> str:
    buffer = io.BytesIO()
    PIL.new("RGB", (side, side), colour).save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


class Square:
    """A tool that draws a green square (``side`` pixels) and answers it, or ``answer`` when given."""

    name, description = "square", "draws a square"
    parameters = {"type": "object", "properties": {}}

    def __init__(self, side: int = 32, answer=None) -> None:
        self.side, self.answer = side, answer

    async def __call__(self, arguments, sample):
        if self.answer is not None:
            return self.answer
        return [{"type": "text", "text": "square:"}, {"type": "image_url", "image_url": {"url": png_url(self.side,
                                                                                                      SQUARE)}}]


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    return build_tiny_vlm(tmp_path_factory.mktemp("vlm") / "tiny-vlm", seed=0)


def colours_prompt() -> list[dict]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": png_url(32, (220, 30, 30))}},
                                         {"type": "text", "text": "which colour?"}]}]


def rollouts(vlm_dir, tmp_path, tool, count=4, **options):
    """``count`` multi-turn samples of the colours prompt, on torchgen, and the trainer."""
    import plasmid_grpo.plugin
    import plasmid_torchgen.plugin
    import plasmid_torchtrain.plugin

    from plasmid_torch.hf import load_tokenizer

    config = testing.make_config(plasmid_multiturn.plugin, plasmid_torchgen.plugin, plasmid_torchtrain.plugin,
                                 plasmid_grpo.plugin, model=str(vlm_dir), run_dir=tmp_path / "run",
                                 generate="multiturn", max_turns=2, max_response_tokens=120,
                                 tool_parser="tiny-first-letter",
                                 **{"tool_call_format": "chat-template", **options})
    engine = testing.build("engine", "torchgen", plasmid_torchgen.plugin, config=config)
    loss = testing.build("loss", "grpo", plasmid_grpo.plugin, config=config)
    trainer = testing.build("trainer", "torchtrain", plasmid_torchtrain.plugin, config=config, args=(loss,))
    generate = testing.build("generate", "multiturn", plasmid_multiturn.plugin, config=config)
    tokenizer = load_tokenizer(str(vlm_dir))
    ctx = RolloutContext(config=config, engines=[engine], data_source=None, tokenizer=tokenizer, generate=generate,
                         rewards=None, tools={tool.name: tool})
    ids, reference = VisionEncoder(str(vlm_dir)).encode(colours_prompt(), "test")     # as a data source makes it
    samples = [Sample(prompt=colours_prompt(), tokens=list(ids), metadata={VISION_KEY: reference}, index=k)
               for k in range(count)]

    async def main():
        return await asyncio.gather(*(generate(ctx, sample, SamplingParams(
            temperature=1.0, max_new_tokens=6, stop_token_ids=(EOS_ID,), seed=5 + k))
            for k, sample in enumerate(samples)))

    return asyncio.run(main()), trainer


def test_a_tool_image_is_in_the_next_turn_masked_generated_with_and_scored_alike_by_the_trainer(vlm_dir, tmp_path):
    samples, trainer = rollouts(vlm_dir, tmp_path, Square())
    with_tool = [s for s in samples if s.metadata["rollout_metrics"]["tool_calls_mean"] == 1.0]
    assert with_tool, "the untrained model wrote a letter, a call of the tool, in some first turn"
    for sample in with_tool:
        assert sample.metadata["rollout_metrics"]["tool_errors_mean"] == 0.0
        assert sample.metadata["rollout_metrics"]["turns_mean"] == 2.0
        images = sample.metadata[VISION_KEY]["images"]
        assert len(images) == 2 and images[1]["image"] == png_url(32, SQUARE)
        prompt, response = sample.prompt_tokens, sample.response_tokens
        assert prompt.count(IMAGE_PAD_ID) == 4, "the prompt's 32x32 image is 4 image tokens"
        at = [i for i, token in enumerate(response) if token == IMAGE_PAD_ID]
        assert len(at) == 4 and all(sample.loss_mask[i] == 0 for i in at), "the square's 4 tokens, loss-masked"
        assert sample.loss_mask[at[-1] + 2:] and all(sample.loss_mask[at[-1] + 2:]), \
            "the engine generated a second turn after the image (vision end)"
    trainer_logprobs = testing.run(trainer.logprobs(samples, 1.0))
    for sample, values in zip(samples, trainer_logprobs, strict=True):
        trained = [(a, b) for a, b, m in zip(sample.rollout_logprobs, values, sample.loss_mask, strict=True) if m]
        assert trained and max(abs(a - b) for a, b in trained) <= 1e-4, "the trainer's log-probs are the engine's"


@pytest.mark.parametrize(("tool", "options", "told"), [
    (Square(side=64), {"tool_max_image_pixels": 32 * 32},
     "error: tool 'square' answer part 1: image of 64x64 pixels is over the limit of 1024 pixels"),
    (Square(answer=[{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]), {},
     "error: tool 'square' answer part 0: cannot decode the image"),
    (Square(answer=[{"type": "image_url", "image_url": {"url": png_url(32, SQUARE)}}] * 2), {"tool_max_images": 1},
     "error: tool 'square' answer: 2 images, over the limit of 1"),
])
def test_an_image_answer_the_run_cannot_show_is_a_one_line_tool_error(vlm_dir, tmp_path, tool, options, told):
    from plasmid_torch.hf import load_tokenizer

    samples, _ = rollouts(vlm_dir, tmp_path, tool, count=2, **options)
    tokenizer = load_tokenizer(str(vlm_dir))
    called = [s for s in samples if s.metadata["rollout_metrics"]["tool_calls_mean"] == 1.0]
    assert called
    for sample in called:
        assert sample.metadata["rollout_metrics"]["tool_errors_mean"] == 1.0
        assert len(sample.metadata.get(VISION_KEY, {"images": [None]})["images"]) == 1, "only the prompt's image"
        assert told in tokenizer.decode(sample.response_tokens, skip_special_tokens=False)


@pytest.mark.parametrize(("fmt", "engine", "told"), [
    ("tagged", "with-images", "tool 'square' answered an image, and --tool-call-format tagged appends text only "
                              "(chat-template places images)"),
    ("chat-template", "text-only", "tool 'square' answered an image, and the engine TextEngine takes no images "
                                   "(torchgen, sglang and vllm serving a vision-language model do)"),
])
def test_an_image_answer_a_format_or_an_engine_cannot_take_is_refused(vlm_dir, fmt, engine, told):
    """(The tiny VLM's alphabet cannot spell the text formats' tags, so this is asked of the check alone.)"""

    class TextEngine:
        async def generate(self, prompt_ids, params): ...

    class ImageEngine(TextEngine):
        images = staticmethod(lambda sample: [])

        async def generate_with_images(self, prompt_ids, images, params): ...

    config = testing.make_config(plasmid_multiturn.plugin, model=str(vlm_dir), generate="multiturn",
                                 tool_call_format=fmt)
    generate = testing.build("generate", "multiturn", plasmid_multiturn.plugin, config=config)
    view = type("View", (), {"engine_for": lambda self, sample: (ImageEngine if engine == "with-images"
                                                                  else TextEngine)()})()
    answer = [{"type": "image_url", "image_url": {"url": png_url(32, SQUARE)}}]
    with pytest.raises(ValueError) as caught:
        generate.image_answer(view, "square", answer, Sample())
    assert str(caught.value) == told
    content, images = generate.image_answer(view, "square", [{"type": "text", "text": "no image"}], Sample())
    assert content == [{"type": "text", "text": "no image"}] and images == []


def test_an_image_answer_for_a_text_only_policy_is_refused_naming_the_model(tmp_path):
    from plasmid_torch.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "text-model", seed=0)
    config = testing.make_config(plasmid_multiturn.plugin, model=str(model), generate="multiturn",
                                 tool_call_format="chat-template")
    generate = testing.build("generate", "multiturn", plasmid_multiturn.plugin, config=config)
    answer = [{"type": "text", "text": "here"}, {"type": "image_url", "image_url": {"url": png_url(32, SQUARE)}}]
    with pytest.raises(ValueError) as caught:
        generate.image_answer(None, "square", answer, Sample())
    assert str(caught.value) == (f"the policy (--model {model}) cannot read images: {model} is not a "
                                 f"vision-language model (its config has no vision_config)")
