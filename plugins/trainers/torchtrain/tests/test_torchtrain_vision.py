"""torchtrain with a vision-language policy (the tiny Qwen2-VL): --freeze-vision-tower keeps the tower
out of training, and a real run's checkpoint and its export load back as a VLM (image processor too)."""

from __future__ import annotations

import base64
import io

import numpy as np
import plasmid_grpo.plugin
import plasmid_torchtrain.plugin
import pytest
import torch
from plasmid_e2e import run_plasmid

from plasmid import testing
from plasmid.app.cli import main
from plasmid.types import Group, RolloutBatch, Sample
from plasmid_torch import vision

PIL = pytest.importorskip("PIL.Image")
ROOT = __import__("pathlib").Path(__file__).resolve().parents[4]


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    from plasmid_torch.tiny_vision import build_tiny_vlm

    return build_tiny_vlm(tmp_path_factory.mktemp("vlm") / "tiny-vlm", seed=0)


def batch(vlm_dir) -> RolloutBatch:
    encoder = vision.VisionEncoder(str(vlm_dir))
    groups = []
    for index, colour in enumerate([(255, 0, 0), (0, 0, 255)]):
        buffer = io.BytesIO()
        PIL.new("RGB", (32, 32), colour).save(buffer, "PNG")
        url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
        messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                 {"type": "text", "text": "colour?"}]}]
        ids, reference = encoder.encode(messages, f"test:{index}")
        response = encoder.tokenizer("red", add_special_tokens=False)["input_ids"]
        samples = [Sample(prompt=messages, tokens=ids + response, response_length=len(response),
                          rollout_logprobs=[-1.0] * len(response), reward=float(k), index=2 * index + k,
                          group_index=index, metadata={vision.VISION_KEY: reference}) for k in range(2)]
        groups.append(Group(samples, index))
    return RolloutBatch(rollout_id=0, groups=groups)


@pytest.mark.parametrize("frozen", [True, False])
def test_a_step_changes_the_vision_tower_only_when_it_is_not_frozen(vlm_dir, tmp_path, frozen):
    torch.set_num_threads(1)
    config = testing.make_config(plasmid_torchtrain.plugin, plasmid_grpo.plugin, model=str(vlm_dir),
                                 run_dir=tmp_path / "run", lr=1e-2, freeze_vision_tower=frozen)
    loss = testing.build("loss", "grpo", plasmid_grpo.plugin, config=config)
    trainer = testing.build("trainer", "torchtrain", plasmid_torchtrain.plugin, config=config, args=(loss,))
    tower = vision.vision_tower(trainer.model)
    before = {name: p.detach().clone() for name, p in tower.named_parameters()}
    text_before = trainer.model.lm_head.weight.detach().clone()
    testing.run(trainer.train_step(batch(vlm_dir)))
    moved = [name for name, p in tower.named_parameters() if not torch.equal(p.detach(), before[name])]
    assert not torch.equal(trainer.model.lm_head.weight.detach(), text_before)   # the text model trained
    with_state = {id(p) for p in trainer.optimizer.state}
    if frozen:
        assert not moved and not any(id(p) in with_state for p in tower.parameters())
    else:
        assert moved and all(id(p) in with_state for p in tower.parameters())


def test_a_checkpoint_and_its_export_load_as_a_vision_language_model(tmp_path):
    import transformers

    run_dir = tmp_path / "run"
    done = run_plasmid("train", "--config", str(ROOT / "examples" / "tiny-vlm.yaml"), "--colours-warmup-steps", "2",
                       "--num-rollouts", "2", "--prompts-per-step", "2", "--n-samples-per-prompt", "2",
                       "--eval-interval", "0", "--save-interval", "1", "--schedule", "async",
                       "--placement", "disaggregate", "--partial-rollout", "--run-dir", str(run_dir), cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    checkpoint = sorted((run_dir / "checkpoints").glob("step_*"))[-1] / "trainer" / "model"
    out = tmp_path / "exported"
    assert main(["export", str(run_dir), str(out)]) == 0
    for directory in (checkpoint, out):
        model = transformers.AutoModelForImageTextToText.from_pretrained(str(directory))
        assert model.config.vision_config.patch_size == 8
        assert type(transformers.AutoImageProcessor.from_pretrained(str(directory))).__name__.startswith(
            "Qwen2VLImageProcessor")
        assert vision.VisionEncoder(str(directory)).image_token_id == model.config.image_token_id
    exported = transformers.AutoModelForImageTextToText.from_pretrained(str(out)).state_dict()
    saved = transformers.AutoModelForImageTextToText.from_pretrained(str(checkpoint)).state_dict()
    assert all(np.array_equal(exported[name].numpy(), saved[name].numpy()) for name in saved)
