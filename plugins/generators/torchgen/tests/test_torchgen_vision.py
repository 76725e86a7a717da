"""Prompts with images on the tiny Qwen2-VL (plasmid_torch.tiny_vision): image parts decoded and
checked, torchgen generating through its vision path, torchtrain's log-probs of the same samples
agreeing with the engine's, and a train step's change of a vision-tower weight reaching the engine."""

import asyncio
import base64
import io

import numpy as np
import plasmid_grpo.plugin
import plasmid_torchtrain.plugin
import pytest
import torch
from PIL import Image
from plasmid_torchgen.vision import VisionSingleTurn

from plasmid import testing
from plasmid.errors import UsageError
from plasmid.types import Group, RolloutBatch, Sample, SamplingParams, Status
from plasmid_torch import vision
from plasmid_torch.tiny import EOS_ID
from plasmid_torch.tiny_vision import IMAGE_PAD_ID, build_tiny_vlm

VISION_WEIGHT = "model.visual.blocks.0.mlp.fc1.weight"


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    return build_tiny_vlm(tmp_path_factory.mktemp("vlm") / "tiny-vlm", seed=0)


def png(colour, size=(64, 64)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, "PNG")
    return buffer.getvalue()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def prompt(part) -> list[dict]:
    return [{"role": "user", "content": [part, {"type": "text", "text": "which colour?"}]}]


def test_the_tiny_vlm_loads_with_the_auto_classes_and_expands_the_image_tokens(vlm_dir):
    import transformers

    model = transformers.AutoModelForImageTextToText.from_pretrained(str(vlm_dir))
    assert model.config.vision_config.patch_size == 8
    assert type(transformers.AutoImageProcessor.from_pretrained(str(vlm_dir))).__name__.startswith(
        "Qwen2VLImageProcessor")
    messages = prompt({"type": "image_url", "image_url": {"url": data_url(png((255, 0, 0)))}})
    ids, inputs = vision.VisionEncoder(str(vlm_dir))(messages, vision.load_images(messages, "rows.jsonl:1"))
    assert ids.count(IMAGE_PAD_ID) == 16                    # 64x64 pixels: 8x8 patches, merged 2x2
    assert inputs.image_grid_thw.tolist() == [[1, 8, 8]] and inputs.pixel_values.shape[0] == 64


def test_image_parts_of_every_accepted_form_decode_to_the_same_pixels(tmp_path):
    data = png((0, 0, 255), (40, 24))
    (tmp_path / "blue.png").write_bytes(data)
    parts = [{"type": "image_url", "image_url": {"url": data_url(data)}},
             {"type": "image_url", "image_url": {"url": "blue.png"}},
             {"type": "image", "image": str(tmp_path / "blue.png")},
             {"type": "image", "path": "blue.png"},
             {"type": "image", "bytes": data}]
    images = vision.load_images([{"role": "user", "content": parts}], "rows.jsonl:3", base_dir=tmp_path)
    assert len(images) == 5
    assert all(np.array_equal(np.asarray(image), np.asarray(images[0])) for image in images)
    assert images[0].size == (40, 24)


@pytest.mark.parametrize(("part", "expected"), [
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}, "bad base64"),
    ({"type": "image", "bytes": b"not an image"}, "cannot decode the image"),
    ({"type": "image", "path": "missing.png"}, "cannot read image"),
    ({"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}, "no downloads"),
    ({"type": "image"}, "has no image"),
    ({"type": "image", "bytes": png((1, 2, 3), (80, 80))}, "over the limit of 4096 pixels"),
])
def test_a_bad_image_is_one_line_naming_file_row_and_image(tmp_path, part, expected):
    with pytest.raises(UsageError) as caught:
        vision.load_images(prompt(part), "rows.jsonl:7", base_dir=tmp_path, max_pixels=64 * 64)
    message = str(caught.value)
    assert message.startswith("rows.jsonl:7: image 1: ") and expected in message and "\n" not in message


def make_config(vlm_dir, tmp_path, **options):
    return testing.make_config(plasmid_torchtrain.plugin, plasmid_grpo.plugin, model=str(vlm_dir),
                               run_dir=tmp_path / "run", lr=1e-2, **options)


def engine_and_trainer(vlm_dir, tmp_path):
    import plasmid_torchgen.plugin

    config = make_config(vlm_dir, tmp_path)
    engine = testing.build("engine", "torchgen", plasmid_torchgen.plugin, config=config)
    loss = testing.build("loss", "grpo", plasmid_grpo.plugin, config=config)
    trainer = testing.build("trainer", "torchtrain", plasmid_torchtrain.plugin, config=config, args=(loss,))
    return config, engine, trainer


class View:
    """The part of a rollout context the generate function reads."""

    def __init__(self, engine, tokenizer):
        self.engines, self.tokenizer = [engine], tokenizer

    def engine_for(self, sample):
        return self.engines[0]


def vision_samples(vlm_dir, colours, n=2, sizes=None):
    encoder = vision.VisionEncoder(str(vlm_dir))
    samples = []
    for index, colour in enumerate(colours):
        size = sizes[index] if sizes else (64, 64)
        messages = prompt({"type": "image_url", "image_url": {"url": data_url(png(colour, size))}})
        ids, reference = encoder.encode(messages, f"test:{index}")
        samples += [Sample(prompt=messages, tokens=list(ids), metadata={vision.VISION_KEY: reference},
                           index=index * n + k, group_index=index) for k in range(n)]
    return encoder, samples


def test_engine_and_trainer_log_probs_agree_and_a_vision_weight_reaches_the_engine(vlm_dir, tmp_path):
    config, engine, trainer = engine_and_trainer(vlm_dir, tmp_path)
    encoder, samples = vision_samples(vlm_dir, [(255, 0, 0), (0, 255, 0)])
    generate = VisionSingleTurn(config)
    params = [SamplingParams(temperature=1.0, max_new_tokens=6, stop_token_ids=(EOS_ID,), seed=i)
              for i in range(len(samples))]
    testing.run(generate.generate_many(View(engine, encoder.tokenizer), samples, params))
    assert all(s.response_length > 0 and s.status in (Status.COMPLETED, Status.TRUNCATED) for s in samples)
    trainer_logprobs = testing.run(trainer.logprobs(samples, 1.0))
    diff = max(abs(a - b) for s, values in zip(samples, trainer_logprobs, strict=True)
               for a, b in zip(s.rollout_logprobs, values, strict=True))
    assert diff <= 1e-4

    before = testing.run(engine.get_weights([VISION_WEIGHT]))[VISION_WEIGHT]
    for position, sample in enumerate(samples):
        sample.reward = float(position % 2)
    batch = RolloutBatch(rollout_id=0, groups=[Group(samples[:2], 0), Group(samples[2:], 1)])
    testing.run(trainer.train_step(batch))
    trained = dict(trainer.export_weights(1 << 30).__next__())[VISION_WEIGHT].detach().float().numpy()
    assert not np.array_equal(trained, before)              # the step moved the vision tower
    for bucket in trainer.export_weights(1 << 20):
        testing.run(engine.update_weights(bucket, 1))
    served = testing.run(engine.get_weights([VISION_WEIGHT]))[VISION_WEIGHT]
    assert np.array_equal(served, trained) and engine.weight_version == 1
    testing.run(engine.shutdown())


def test_text_samples_take_the_ordinary_path_under_the_vision_generate_function(vlm_dir, tmp_path):
    config, engine, _ = engine_and_trainer(vlm_dir, tmp_path)
    tokenizer = vision.VisionEncoder(str(vlm_dir)).tokenizer
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "hello"}], tokenize=True,
                                        add_generation_prompt=True)
    ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    sample = Sample(prompt="hello", tokens=ids)
    calls = []
    original = engine.generate_with_images
    engine.generate_with_images = lambda *args: calls.append(args) or original(*args)
    testing.run(VisionSingleTurn(config)(View(engine, tokenizer), sample, SamplingParams(max_new_tokens=3)))
    assert sample.response_length == 3 and not calls
    testing.run(engine.shutdown())


def test_samples_with_images_round_trip_a_checkpoint_as_json_and_rebuild_the_same_inputs(vlm_dir):
    import json

    from plasmid.groups import group_from_state, group_to_state

    _, samples = vision_samples(vlm_dir, [(255, 0, 0), (0, 0, 255)])
    saved = json.dumps(group_to_state(Group(samples, 0)))              # what in_flight.json / given-back hold
    restored = group_from_state(json.loads(saved)).samples
    images = vision.ImageInputs(str(vlm_dir))
    for before, after in zip(samples, restored, strict=True):
        assert after.metadata == before.metadata and after.tokens == before.tokens
        original, rebuilt = images(before), images(after)
        assert torch.equal(original.pixel_values, rebuilt.pixel_values)
        assert torch.equal(original.image_grid_thw, rebuilt.image_grid_thw)
    assert not torch.equal(images(samples[0]).pixel_values, images(samples[2]).pixel_values)


def test_a_reference_that_is_not_a_list_of_images_is_one_line_naming_the_sample(vlm_dir):
    sample = Sample(prompt="x", tokens=[1], metadata={vision.VISION_KEY: {"images": "red.png"}}, index=5)
    with pytest.raises(UsageError, match=r"^sample 5: metadata\['plasmid_torch.vision'\] must be"):
        vision.ImageInputs(str(vlm_dir))(sample)


def image_requests(vlm_dir):
    """Prompts of different lengths (images of 64x64, 32x48 and 48x32 pixels: 16, 6 and 6 image tokens,
    one with two images), so a batch pads some rows on the left."""
    encoder = vision.VisionEncoder(str(vlm_dir))
    inputs = vision.ImageInputs(str(vlm_dir))
    parts = [[((255, 0, 0), (64, 64))], [((0, 255, 0), (32, 48))], [((0, 0, 255), (48, 32)), ((9, 9, 9), (32, 32))],
             [((255, 255, 0), (32, 32))]]
    requests = []
    for index, images in enumerate(parts):
        messages = [{"role": "user", "content": [*({"type": "image_url", "image_url": {"url": data_url(png(c, s))}}
                                                   for c, s in images), {"type": "text", "text": "which colour?"}]}]
        ids, reference = encoder.encode(messages, f"test:{index}")
        sample = Sample(prompt=messages, tokens=list(ids), metadata={vision.VISION_KEY: reference}, index=index)
        requests.append((list(ids), inputs(sample)))
    assert len({len(ids) for ids, _ in requests}) >= 3
    return requests


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "seeded"])
def test_a_batched_request_with_images_answers_as_it_does_alone(vlm_dir, tmp_path, sampled):
    _, engine, _ = engine_and_trainer(vlm_dir, tmp_path)
    requests = image_requests(vlm_dir)
    params = [SamplingParams(temperature=1.0 if sampled else 0.0, max_new_tokens=4 + 2 * i, seed=10 + i if sampled
                             else None, stop_token_ids=(EOS_ID,) if i % 2 else ()) for i in range(len(requests))]
    alone = [testing.run(engine.generate_with_images(ids, images, p))
             for (ids, images), p in zip(requests, params, strict=True)]
    batches = engine.stats()["batches"]

    async def together():
        return await asyncio.gather(*(engine.generate_with_images(ids, images, p)
                                      for (ids, images), p in zip(requests, params, strict=True)))

    batched = testing.run(together())
    stats = engine.stats()
    assert stats["batches"] == batches + 1 and stats["max_batch_size"] == 4   # the four calls made one batch
    assert stats["generated_tokens"] == 2 * sum(len(o.token_ids) for o in alone) and stats["busy_seconds"] > 0
    assert [o.token_ids for o in batched] == [o.token_ids for o in alone]
    assert [o.status for o in batched] == [o.status for o in alone]
    assert all(o.status == Status.TRUNCATED and len(o.token_ids) == p.max_new_tokens
               for o, p in zip(alone, params, strict=True) if not p.stop_token_ids)
    np.testing.assert_allclose([lp for o in batched for lp in o.logprobs], [lp for o in alone for lp in o.logprobs],
                               rtol=0, atol=1e-5)
    assert not any(token in vision.vision_token_ids(engine.model.config) for o in batched for token in o.token_ids)
    testing.run(engine.shutdown())


def test_batched_log_probs_are_the_trainers_and_unseeded_rows_follow_the_configured_seed(vlm_dir, tmp_path):
    config, engine, trainer = engine_and_trainer(vlm_dir, tmp_path)
    sizes = [(64, 64), (32, 48), (32, 32)]                              # prompts of three lengths
    encoder, samples = vision_samples(vlm_dir, [(255, 0, 0), (0, 255, 0), (0, 0, 255)], n=3, sizes=sizes)
    params = [SamplingParams(temperature=1.0, max_new_tokens=5, stop_token_ids=(EOS_ID,)) for _ in samples]
    testing.run(VisionSingleTurn(config).generate_many(View(engine, encoder.tokenizer), samples, params))
    assert engine.stats()["batches"] == 1
    trainer_logprobs = testing.run(trainer.logprobs(samples, 1.0))
    assert max(abs(a - b) for s, values in zip(samples, trainer_logprobs, strict=True)
               for a, b in zip(s.rollout_logprobs, values, strict=True)) <= 1e-4
    _, again = vision_samples(vlm_dir, [(255, 0, 0), (0, 255, 0), (0, 0, 255)], n=3, sizes=sizes)
    _, other_engine, _ = engine_and_trainer(vlm_dir, tmp_path / "other")
    testing.run(VisionSingleTurn(config).generate_many(View(other_engine, encoder.tokenizer), again, params))
    assert [s.tokens for s in again] == [s.tokens for s in samples]     # the same --seed, the same draws
    assert len({tuple(s.tokens) for s in samples}) > 1                  # rows of one prompt draw differently
    testing.run(engine.shutdown())
    testing.run(other_engine.shutdown())


def test_abort_all_answers_image_requests_still_waiting_for_a_batch(vlm_dir, tmp_path):
    _, engine, _ = engine_and_trainer(vlm_dir, tmp_path)
    requests = image_requests(vlm_dir)[:2]

    async def queue_then_abort():
        calls = [asyncio.ensure_future(engine.generate_with_images(ids, images, SamplingParams(max_new_tokens=3)))
                 for ids, images in requests]
        await asyncio.sleep(0)                              # queued, the batch not started
        aborted = await engine.abort_all()
        return aborted, await asyncio.gather(*calls)

    aborted, outputs = testing.run(queue_then_abort())
    assert aborted == 2 and [(o.status, o.token_ids) for o in outputs] == [(Status.ABORTED, [])] * 2
    after = testing.run(engine.generate_with_images(*requests[0], SamplingParams(max_new_tokens=3)))
    assert after.status == Status.TRUNCATED and len(after.token_ids) == 3      # the queue still serves
    testing.run(engine.shutdown())
