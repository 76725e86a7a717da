"""Prompts with images on the ``sglang`` engine, end to end through a stand-in SGLang server.

The server is TEST SUPPORT (``sglang_image_standin.py``): it speaks SGLang's native ``/generate`` with
``image_data`` and runs the tiny Qwen2-VL with transformers, because the real CPU servers of these
tests cannot serve a vision-language model (see its docstring). What is checked is the engine's side:
the request (``image_data`` as data URLs, one image token per image in ``input_ids``), the expanded
prompt the server reports against plasmid's, log-probs of ``--generate vision`` (plasmid-torchgen's
generate function) that line up with torchtrain's on the same images (within the text path's bound,
``test_sglang_train.LOGPROB_BOUND``), and one error naming the engine for images sent to a text-only model.
"""

from __future__ import annotations

import base64
import io

import plasmid_sglang.plugin
import pytest

from plasmid.errors import ProviderError, UsageError
from plasmid.testing import build, make_config, run
from plasmid.types import Sample, SamplingParams

PIL = pytest.importorskip("PIL.Image")
pytest.importorskip("plasmid_torchtrain")
pytest.importorskip("plasmid_grpo")
pytest.importorskip("plasmid_torchgen")

#: engine and trainer log-probs on the same image: the text path's bound (test_sglang_train.py)
LOGPROB_BOUND = 1e-5


def image_url(colour: tuple[int, int, int], size: tuple[int, int] = (32, 32)) -> str:
    buffer = io.BytesIO()
    PIL.new("RGB", size, colour).save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def messages(*urls: str) -> list[dict]:
    return [{"role": "user", "content": [*({"type": "image_url", "image_url": {"url": url}} for url in urls),
                                         {"type": "text", "text": "colour?"}]}]


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    from plasmid_torch.tiny_vision import build_tiny_vlm

    return build_tiny_vlm(tmp_path_factory.mktemp("sglang-vlm") / "tiny-vlm", seed=0)


@pytest.fixture(scope="module")
def standin(vlm_dir):
    from sglang_image_standin import SGLangImageStandIn

    server = SGLangImageStandIn(str(vlm_dir)).start()
    yield server
    server.stop()


def attached(model_dir, standin, tmp_path):
    config = make_config(plasmid_sglang.plugin, run_dir=tmp_path, model=str(model_dir),
                         sglang_external_addrs=standin.address, sglang_health_interval=0)
    return build("engine", "sglang", plasmid_sglang.plugin, config=config)


@pytest.fixture(scope="module")
def engine(vlm_dir, standin, tmp_path_factory):
    built = attached(vlm_dir, standin, tmp_path_factory.mktemp("sglang-vlm-run"))
    yield built
    built.close()


def sample_of(vlm_dir, prompt, index=0) -> Sample:
    from plasmid_torch import vision

    ids, reference = vision.VisionEncoder(str(vlm_dir)).encode(prompt, f"test:{index}")
    return Sample(prompt=prompt, tokens=ids, index=index, metadata={vision.VISION_KEY: reference})


def test_images_go_to_sglang_as_image_data_beside_one_image_token_per_image(engine, standin, vlm_dir):
    from plasmid_torch.tiny_vision import IMAGE_PAD_ID

    red, blue = image_url((255, 0, 0)), image_url((0, 0, 255), (64, 32))
    sample = sample_of(vlm_dir, messages(red, blue))
    images = engine.images(sample)
    assert images == [red, blue], "the engine sends the images as the sample names them (data URLs)"
    output = run(engine.generate_with_images(sample.tokens, images, SamplingParams(max_new_tokens=4, seed=1)))
    body = standin.bodies[-1]
    assert body["image_data"] == [red, blue]
    assert body["input_ids"].count(IMAGE_PAD_ID) == 2, "one image token per image: SGLang expands them"
    assert sample.tokens.count(IMAGE_PAD_ID) == 4 + 8, "plasmid's prompt: 4 tokens for 32x32, 8 for 64x32"
    assert [t for t in body["input_ids"] if t != IMAGE_PAD_ID] == [t for t in sample.tokens if t != IMAGE_PAD_ID]
    assert len(output.token_ids) == 4 and len(output.logprobs) == 4


class View:
    """The part of a rollout context a generate function reads."""

    def __init__(self, engine, tokenizer):
        self.engines, self.tokenizer = [engine], tokenizer

    def engine_for(self, sample):
        return self.engines[0]


def test_through_generate_vision_log_probs_with_images_match_torchtrains_on_the_same_images(engine, standin,
                                                                                            vlm_dir, tmp_path):
    """``--generate vision`` (plasmid-torchgen's generate function, as a rollout calls it) on the sglang
    engine, then torchtrain's log-probs of the same samples."""
    import plasmid_grpo.plugin
    import plasmid_torchgen.plugin
    import plasmid_torchtrain.plugin
    import torch
    from plasmid_torchgen.vision import VisionSingleTurn

    from plasmid import testing
    from plasmid_torch.vision import VisionEncoder

    torch.set_num_threads(1)
    samples = [sample_of(vlm_dir, messages(image_url(colour)), index) for index, colour in
               enumerate([(0, 160, 60), (200, 30, 90)])]
    params = [SamplingParams(temperature=1.0, max_new_tokens=12, seed=3 + i) for i in range(len(samples))]
    generate = VisionSingleTurn(make_config(plasmid_torchgen.plugin, run_dir=tmp_path / "generate"))
    run(generate.generate_many(View(engine, VisionEncoder(str(vlm_dir)).tokenizer), samples, params))
    assert [s.response_length for s in samples] == [12, 12]
    assert [len(body.get("image_data", [])) for body in standin.bodies[-2:]] == [1, 1], "the images were sent"
    config = testing.make_config(plasmid_torchtrain.plugin, plasmid_grpo.plugin, model=str(vlm_dir),
                                 run_dir=tmp_path / "run")
    loss = testing.build("loss", "grpo", plasmid_grpo.plugin, config=config)
    trainer = testing.build("trainer", "torchtrain", plasmid_torchtrain.plugin, config=config, args=(loss,))
    trained = run(trainer.logprobs(samples, 1.0))
    diff = max(abs(a - b) for sample, values in zip(samples, trained, strict=True)
               for a, b in zip(sample.rollout_logprobs, values, strict=True))
    assert diff <= LOGPROB_BOUND, f"engine and trainer log-probs disagree: max {diff:.2e}"


def test_another_image_changes_the_response(engine, vlm_dir):
    greedy = SamplingParams(temperature=0.0, max_new_tokens=6)
    answers = []
    for colour in ((255, 0, 0), (0, 0, 255)):
        sample = sample_of(vlm_dir, messages(image_url(colour)))
        answers.append(run(engine.generate_with_images(sample.tokens, engine.images(sample), greedy)))
    assert answers[0].logprobs != answers[1].logprobs, "the image reached the model: its logits changed"
    again = sample_of(vlm_dir, messages(image_url((255, 0, 0))))
    repeat = run(engine.generate_with_images(again.tokens, engine.images(again), greedy))
    assert (repeat.token_ids, repeat.logprobs) == (answers[0].token_ids, answers[0].logprobs)


def test_a_server_that_expands_the_images_otherwise_fails_the_request_naming_it(engine, standin, vlm_dir):
    from plasmid_torch.tiny_vision import IMAGE_PAD_ID

    sample = sample_of(vlm_dir, messages(image_url((9, 9, 9))))
    first = sample.tokens.index(IMAGE_PAD_ID)
    shorter = sample.tokens[:first] + sample.tokens[first + 1:]   # one image token fewer than the server makes
    with pytest.raises(ProviderError, match=r"sglang generate: .* expanded the prompt with its images into other "
                                            r"ids \(\d+ tokens\) than plasmid's"):
        run(engine.generate_with_images(shorter, engine.images(sample), SamplingParams(max_new_tokens=2)))


def test_images_for_a_text_only_model_are_one_error_naming_the_engine(standin, vlm_dir, tmp_path):
    from plasmid_torch.tiny import build_tiny_model

    text_model = build_tiny_model(tmp_path / "text", arch="llama", seed=0)
    text_engine = attached(text_model, standin, tmp_path / "run")
    try:
        sample = sample_of(vlm_dir, messages(image_url((1, 2, 3))), index=7)
        with pytest.raises(UsageError, match=r"^engine 'sglang' \(plugin plasmid-sglang, model .*text\): sample 7 "
                                             r"has images, but the model is text-only"):
            text_engine.images(sample)
        with pytest.raises(UsageError, match=r"^engine 'sglang' .*a prompt with images, but the model is text-only"):
            run(text_engine.generate_with_images([1, 4], [image_url((1, 2, 3))], SamplingParams(max_new_tokens=1)))
    finally:
        text_engine.close()
