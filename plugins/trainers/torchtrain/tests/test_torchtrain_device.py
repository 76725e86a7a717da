"""--device, --precision, --gradient-checkpointing and --optimizer-offload of the torch trainer, on
the CPU (the CUDA-only paths, the offload hooks on a GPU, run in
benchmarks/gpu_check.py)."""

from __future__ import annotations

import math

import plasmid_torchtrain.plugin
import pytest
import torch

from plasmid import testing
from plasmid.errors import UsageError
from plasmid_torch import device
from plasmid_torch.testing.contracts.trainer import ContractLoss, make_rollout_batch

VOCAB = 16


def exported(trainer) -> dict[str, torch.Tensor]:
    """The exported weights by name, as float32 copies (bfloat16 has no numpy dtype)."""
    return {name: tensor.float() for bucket in trainer.export_weights(1 << 40) for name, tensor in bucket}


@pytest.fixture
def make_trainer(model_dir, tmp_path):
    def factory(**options):
        options = {"lr": 1e-3, "model": str(model_dir), "run_dir": tmp_path / "run", **options}
        config = testing.make_config(plasmid_torchtrain.plugin, **options)
        loss = ContractLoss()
        return testing.build("trainer", "torchtrain", plasmid_torchtrain.plugin, config=config, args=(loss,))

    return factory


def test_auto_is_the_cpu_without_a_gpu_and_cuda_with_one(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device.resolve_device("auto", "torchtrain") == torch.device("cpu")
    assert device.resolve_device("cpu", "torchtrain") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert device.resolve_device("auto", "torchtrain") == torch.device("cuda", 1)
    assert device.resolve_device("cpu", "torchtrain") == torch.device("cpu")


def test_cuda_without_a_gpu_is_a_one_line_error_when_the_trainer_is_built(make_trainer, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UsageError, match=r"^torchtrain: --device cuda, but torch .* sees no CUDA GPU") as failure:
        make_trainer(device="cuda")
    assert "\n" not in str(failure.value)


def test_a_bad_device_or_precision_is_refused_naming_the_flag():
    with pytest.raises(UsageError, match="--device"):
        testing.make_config(plasmid_torchtrain.plugin, device="tpu")
    with pytest.raises(UsageError, match="--precision"):
        testing.make_config(plasmid_torchtrain.plugin, precision="fp8")


def test_optimizer_offload_on_the_cpu_is_a_one_line_error(make_trainer):
    with pytest.raises(UsageError, match=r"^torchtrain: --optimizer-offload .* runs on cpu"):
        make_trainer(optimizer_offload=True)


def test_the_defaults_on_the_cpu_are_float32_fused_adamw_and_no_autocast(make_trainer):
    trainer = make_trainer()
    assert trainer.place == device.Placement(torch.device("cpu"), "fp32", None)
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}
    assert trainer.optimizer.defaults.get("fused") is True
    assert not torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize("precision", ["bf16", "bf16-autocast"])
def test_bf16_trains_a_few_steps_on_the_cpu(make_trainer, precision):
    trainer = make_trainer(precision=precision)
    expected = torch.bfloat16 if precision == "bf16" else torch.float32
    assert {p.dtype for p in trainer.model.parameters()} == {expected}
    start = exported(trainer)
    losses = []
    for step in range(3):
        metrics = testing.run(trainer.train_step(make_rollout_batch(VOCAB, seed=step)))
        assert not [name for name in metrics if name.startswith("train/bad_step")], metrics
        losses.append(metrics["train/loss"])
        assert math.isfinite(metrics["train/grad_norm"]) and metrics["train/grad_norm"] > 0
    assert all(math.isfinite(value) for value in losses)
    after = exported(trainer)
    assert any(not torch.equal(start[name], after[name]) for name in start)
    assert trainer.updates == 3


def test_autocast_runs_the_matrix_products_in_bf16(make_trainer, monkeypatch):
    trainer = make_trainer(precision="bf16-autocast")
    seen = []
    layer = trainer.model.model.layers[0].mlp.up_proj
    layer.register_forward_hook(lambda module, args, output: seen.append(output.dtype))
    testing.run(trainer.logprobs(make_rollout_batch(VOCAB).samples, 1.0))
    assert seen and set(seen) == {torch.bfloat16}
    assert layer.weight.dtype == torch.float32


def test_gradient_checkpointing_gives_the_loss_gradients_and_update_of_a_plain_step(make_trainer):
    plain, checkpointed = make_trainer(), make_trainer(gradient_checkpointing=True)
    assert not checkpointed.share_prompts     # checkpointing keeps no KV cache: one pass per micro-batch
    plain.share_prompts = False               # so the plain step takes one pass too (AdamW's first update
    calls = []                                # moves near-zero gradients' weights by a whole lr either way)
    for layer in checkpointed.model.model.layers:
        original = layer._gradient_checkpointing_func

        def counted(*args, _original=original, **kwargs):
            calls.append(1)
            return _original(*args, **kwargs)

        layer._gradient_checkpointing_func = counted
    batch = make_rollout_batch(VOCAB, seed=3)
    first = testing.run(plain.train_step(batch))
    second = testing.run(checkpointed.train_step(make_rollout_batch(VOCAB, seed=3)))
    assert len(calls) == len(checkpointed.model.model.layers)     # one checkpointed forward per layer
    assert second["train/loss"] == pytest.approx(first["train/loss"], abs=1e-6)
    assert second["train/grad_norm"] == pytest.approx(first["train/grad_norm"], rel=1e-5)
    for (name, a), (_, b) in zip(exported(plain).items(), exported(checkpointed).items(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)
    # the trainer's model stays deterministic: dropout modules are still in eval mode
    assert not any(m.training for m in checkpointed.model.modules() if isinstance(m, torch.nn.Dropout))
