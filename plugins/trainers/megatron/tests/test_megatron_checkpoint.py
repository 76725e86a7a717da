"""The megatron trainer's checkpoints: the critic resumes with the policy, a checkpoint that cannot
resume is refused with what to do, a failed save leaves the previous checkpoint as it was, and a
mixture-of-experts checkpoint written with expert parallelism resumes in one process. (Tensor and
data parallelism to one process: test_megatron_parallel.py.)"""

from __future__ import annotations

import numpy as np
import plasmid_grpo.plugin
import plasmid_megatron.plugin
import plasmid_ppo.plugin
import pytest
import torch
from plasmid_megatron import checkpoint
from plasmid_megatron.model import unwrapped

from plasmid import testing
from plasmid_torch.testing.contracts.trainer import exported, make_rollout_batch

VOCAB = 16


@pytest.fixture
def make_trainer(model_dir, tmp_path):
    """``make_trainer(loss="grpo"|"ppo", **options)``: a megatron trainer with Adam at lr 1e-3."""
    plugins = {"grpo": plasmid_grpo.plugin, "ppo": plasmid_ppo.plugin}

    def factory(loss="grpo", **options):
        options = {"trainer": "megatron", "model": str(model_dir), "lr": 1e-3, "critic_lr": 2e-3,
                   "megatron_optimizer": "adam", "run_dir": tmp_path / "run", **options}
        config = testing.make_config(plasmid_megatron.plugin, plugins[loss], **options)
        built = testing.build("loss", loss, plugins[loss], config=config)
        return testing.build("trainer", "megatron", plasmid_megatron.plugin, config=config, args=(built,))

    return factory


def critic_weights(trainer) -> dict[str, np.ndarray]:
    return {name: param.detach().float().numpy().copy()
            for name, param in unwrapped(trainer.critic.model).named_parameters()}


def equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return set(a) == set(b) and all(np.array_equal(a[name], b[name]) for name in a)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_critic_resumes_with_the_policy(make_trainer, tmp_path, precision):
    """PPO: policy and critic (weights, Adam state, LR schedules) and the counters come back, so
    the step after the resume is bit-identical to the uninterrupted one. In bf16 every trained
    parameter (norms and value head too) is bf16, with float32 main weights in the optimizer."""
    batches = [make_rollout_batch(VOCAB, seed=seed, rollout_id=seed) for seed in range(3)]
    options = dict(loss="ppo", lr_schedule="cosine", lr_warmup_steps=1, num_rollouts=3, critic_warmup_steps=1)
    if precision == "bf16":
        options["megatron_bf16"] = True
    straight = make_trainer(**options)
    if precision == "bf16":
        for model in (straight.model, straight.critic.model):
            assert {param.dtype for param in model.parameters()} == {torch.bfloat16}
    for batch in batches[:2]:
        testing.run(straight.train_step(batch))
    testing.run(straight.save(str(tmp_path / "ckpt")))
    expected = testing.run(straight.train_step(batches[2]))

    resumed = make_trainer(**options)
    testing.run(resumed.load(str(tmp_path / "ckpt")))
    assert (resumed.steps, resumed.updates) == (2, 1)           # the warm-up step updated only the critic
    got = testing.run(resumed.train_step(batches[2]))
    for name in ("train/loss", "train/value_loss", "train/critic_grad_norm", "train/critic_lr", "train/lr"):
        assert got[name] == expected[name], name
    assert equal(exported(resumed), exported(straight))
    assert equal(critic_weights(resumed), critic_weights(straight))
    assert not equal(critic_weights(resumed), critic_weights(make_trainer(**options)))


def test_a_checkpoint_of_other_trainables_or_another_optimizer_is_refused(make_trainer, tmp_path):
    trainer = make_trainer()
    testing.run(trainer.train_step(make_rollout_batch(VOCAB)))
    testing.run(trainer.save(str(tmp_path / "ckpt")))
    with pytest.raises(ValueError, match=r"holds \['policy'\] but this trainer trains \['critic', 'policy'\]"):
        testing.run(make_trainer(loss="ppo").load(str(tmp_path / "ckpt")))
    with pytest.raises(ValueError, match="written with the optimizers .*'sgd'.*--megatron-optimizer"):
        testing.run(make_trainer(megatron_optimizer="sgd").load(str(tmp_path / "ckpt")))


def test_a_checkpoint_of_the_earlier_format_names_its_weights(make_trainer, tmp_path):
    (tmp_path / "old" / "trainer_state").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"earlier plasmid-megatron .* --model .*old/model"):
        testing.run(make_trainer().load(str(tmp_path / "old")))


@pytest.mark.parametrize("failing", ["model files", "distributed checkpoint"])
def test_a_failed_save_leaves_the_previous_checkpoint(failing, make_trainer, tmp_path, monkeypatch):
    from megatron.core import dist_checkpointing

    trainer = make_trainer()
    testing.run(trainer.save(str(tmp_path / "ckpt")))
    before = {p.relative_to(tmp_path): p.read_bytes() for p in (tmp_path / "ckpt").rglob("*") if p.is_file()}
    testing.run(trainer.train_step(make_rollout_batch(VOCAB)))

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(*((checkpoint, "copy_model_files") if failing == "model files" else
                          (dist_checkpointing, "save")), broken)
    with pytest.raises(OSError, match="disk full"):
        testing.run(trainer.save(str(tmp_path / "ckpt")))
    after = {p.relative_to(tmp_path): p.read_bytes() for p in (tmp_path / "ckpt").rglob("*") if p.is_file()}
    assert after == before

    monkeypatch.undo()
    testing.run(trainer.save(str(tmp_path / "ckpt")))           # the stale staging directory is replaced
    assert not (tmp_path / "ckpt.tmp").exists() and not (tmp_path / "ckpt.old").exists()
    fresh = make_trainer()
    testing.run(fresh.load(str(tmp_path / "ckpt")))
    assert fresh.steps == 1 and equal(exported(fresh), exported(trainer))


def test_an_expert_parallel_checkpoint_resumes_in_a_single_process(tmp_path):
    """EP=2 -> 1 on a mixture-of-experts model with Adam: megatron gives the expert parameters an
    optimizer of their own only with expert parallelism, so the optimizers' layout changes too. The
    step after the resume equals the one the 2-process trainer made after writing the checkpoint,
    unlike the same step from the checkpoint's weights with a new Adam."""
    from safetensors.numpy import load_file
    from test_megatron_moe import build_moe_model
    from test_megatron_parallel import COMPARED, run_layout

    model = build_moe_model(tmp_path / "model", "qwen2_moe")
    options = {"micro_batch_size": 2, "global_batch_size": 5, "megatron_optimizer": "adam", "lr": 1e-3}
    expected = run_layout(model, tmp_path / "ep2", 2, options={**options, "expert_model_parallel_size": 2},
                          **{"continue": True})
    got = run_layout(model, tmp_path / "single", 1, options=options, resume_from=str(tmp_path / "ep2" / "ckpt"),
                     fresh_optimizer=True)
    assert got["counters"] == [2, 6]
    for name in COMPARED:
        assert got["third"][name] == pytest.approx(expected["third"][name], rel=1e-5, abs=1e-6), name
    continued = load_file(str(tmp_path / "ep2" / "third.safetensors"))
    resumed = load_file(str(tmp_path / "single" / "third.safetensors"))
    fresh = load_file(str(tmp_path / "single" / "third_fresh.safetensors"))
    assert set(resumed) == set(continued)
    for name, value in continued.items():
        assert np.allclose(resumed[name], value, atol=2e-6, rtol=0), name
    assert max(float(np.abs(fresh[name] - value).max()) for name, value in continued.items()) > 1e-4
