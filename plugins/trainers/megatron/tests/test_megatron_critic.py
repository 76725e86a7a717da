"""The megatron trainer's critic (PPO): values at the right positions, one step equal to the torch
trainer's, warm-up, the critic's LR schedule, the parallel layouts against a single process, and
the trainer contract with the ppo loss."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import plasmid_grpo.plugin
import plasmid_megatron.plugin
import plasmid_ppo.plugin
import pytest
import torch
from critic_worker import head_weights, make_trainer, run, set_value_head
from multiprocess import run_ranks
from plasmid_megatron.model import unwrapped

from plasmid import testing
from plasmid_torch.hf import load_causal_lm
from plasmid_torch.testing.contracts.trainer import TrainerContract, exported, make_rollout_batch

VOCAB = 16
WORKER = Path(__file__).resolve().parent / "critic_worker.py"


@pytest.fixture
def ppo_trainer(model_dir, tmp_path):
    """``ppo_trainer(**options)``: a megatron trainer with the ppo loss (Adam at lr 1e-3, critic 2e-3)."""
    def factory(**options):
        return make_trainer(str(model_dir), tmp_path, {"lr": 1e-3, "critic_lr": 2e-3, "megatron_optimizer": "adam",
                                                       "micro_batch_size": 256, **options})

    return factory


def critic_body(trainer) -> dict[str, np.ndarray]:
    """The megatron critic's body (no value head) in Hugging Face names (one rank: no gathering)."""
    weights = {}
    for name, param in unwrapped(trainer.critic.model).named_parameters():
        if not name.startswith("output_layer."):
            for hf_name, tensor in trainer.converter.merge(trainer.converter.rule(name), [param.detach()]):
                weights[hf_name] = tensor.numpy().copy()
    return weights


def head_of(trainer) -> np.ndarray:
    head = trainer.critic.value_head
    return torch.cat([head.weight.detach().flatten(), head.bias.detach()]).numpy().copy()


# ------------------------------------------------------------------------------------------------


def test_the_value_head_starts_at_zero_and_values_are_read_where_each_token_is_predicted(ppo_trainer, model_dir):
    trainer = ppo_trainer()
    samples = make_rollout_batch(VOCAB).samples
    assert not head_of(trainer).any()
    assert all(value == 0.0 for row in testing.run(trainer.values(samples)) for value in row)

    weight, bias = head_weights(trainer.spec.hidden_size)
    set_value_head(trainer, weight, bias)
    values = testing.run(trainer.values(samples))
    reference = load_causal_lm(str(model_dir)).model        # Hugging Face's body, final norm included
    for sample, got in zip(samples, values, strict=True):
        with torch.no_grad():
            hidden = reference(input_ids=torch.tensor([sample.tokens])).last_hidden_state[0]
        every_position = hidden @ weight[0] + bias
        # the state before response token t is position prompt_length - 1 + t
        expected = every_position[sample.prompt_length - 1: len(sample.tokens) - 1]
        assert len(got) == sample.response_length
        assert np.allclose(got, expected.numpy(), atol=1e-5, rtol=0)


@pytest.mark.skipif(importlib.util.find_spec("plasmid_torchtrain") is None, reason="needs plasmid-torchtrain")
def test_a_ppo_step_equals_the_torch_trainers(model_dir, tmp_path, ppo_trainer):
    """Same model, value head, batch and Adam settings: values before the update, every metric, and
    the policy's and critic's weights after it. Weights get a tolerance of a tenth of the step:
    Adam's first update moves each weight by about lr * sign(grad), so float rounding of a
    near-zero gradient can move a weight differently by up to lr, while a wrong gradient moves
    many by about lr."""
    import plasmid_torchtrain.plugin

    config = testing.make_config(plasmid_torchtrain.plugin, plasmid_ppo.plugin, model=str(model_dir), lr=1e-3,
                                 critic_lr=2e-3, run_dir=tmp_path / "torch")
    loss = testing.build("loss", "ppo", plasmid_ppo.plugin, config=config)
    reference = testing.build("trainer", "torchtrain", plasmid_torchtrain.plugin, config=config, args=(loss,))
    trainer = ppo_trainer(micro_batch_size=3)
    weight, bias = head_weights(trainer.spec.hidden_size)
    with torch.no_grad():
        reference.critic.value_head.weight.copy_(weight)
        reference.critic.value_head.bias.copy_(bias)
    set_value_head(trainer, weight, bias)
    policy_before, body_before = exported(trainer), critic_body(trainer)

    samples = make_rollout_batch(VOCAB).samples
    expected_values = testing.run(reference.values(samples))
    for got, expected in zip(testing.run(trainer.values(samples)), expected_values, strict=True):
        assert np.allclose(got, expected, atol=1e-5, rtol=0)

    expected = testing.run(reference.train_step(make_rollout_batch(VOCAB)))
    got = testing.run(trainer.train_step(make_rollout_batch(VOCAB)))
    expected.pop("train/seconds"), got.pop("train/seconds")
    assert set(got) == set(expected)
    for name in expected:
        assert got[name] == pytest.approx(expected[name], rel=1e-5, abs=1e-6), name
    assert got["train/critic_lr"] == 2e-3 and got["train/lr"] == 1e-3 and got["train/value_loss"] > 0

    policy = exported(trainer)
    for name, value in exported(reference).items():
        assert np.allclose(policy[name], value, atol=1e-4, rtol=0), name
    body = critic_body(trainer)
    reference_body = {f"model.{name}": tensor.detach().numpy() for name, tensor
                      in reference.critic.backbone.state_dict().items()}
    assert set(body) == set(reference_body)
    for name, value in reference_body.items():
        assert np.allclose(body[name], value, atol=1e-4, rtol=0), name
    reference_head = torch.cat([reference.critic.value_head.weight.detach().flatten(),
                                reference.critic.value_head.bias.detach()]).numpy()
    assert np.allclose(head_of(trainer), reference_head, atol=1e-4, rtol=0)
    assert any(not np.array_equal(policy_before[name], policy[name]) for name in policy)
    assert any(not np.array_equal(body_before[name], body[name]) for name in body)


def test_warmup_steps_train_only_the_critic(ppo_trainer):
    trainer = ppo_trainer(critic_warmup_steps=1)
    policy_before = exported(trainer)
    metrics = testing.run(trainer.train_step(make_rollout_batch(VOCAB)))
    assert metrics["train/policy_updated"] == 0.0 and metrics["train/updates"] == 0.0 and trainer.updates == 0
    assert "train/pg_loss" not in metrics and "train/lr" not in metrics
    assert math.isfinite(metrics["train/value_loss"]) and metrics["train/critic_grad_norm"] > 0
    assert all(np.array_equal(policy_before[name], value) for name, value in exported(trainer).items()), \
        "the policy moved in warm-up"
    assert head_of(trainer).any(), "the critic did not train in warm-up"

    metrics = testing.run(trainer.train_step(make_rollout_batch(VOCAB, seed=1)))
    assert metrics["train/policy_updated"] == 1.0 and metrics["train/updates"] == 1.0
    assert any(not np.array_equal(policy_before[name], value) for name, value in exported(trainer).items())


def test_the_critic_lr_follows_the_policy_schedule_scaled_to_critic_lr(ppo_trainer):
    trainer = ppo_trainer(lr_warmup_steps=2, lr_schedule="linear", num_rollouts=2, global_batch_size=4,
                          prompts_per_step=2, n_samples_per_prompt=4, min_lr=1e-4)
    rates = []
    for seed in range(2):
        metrics = testing.run(trainer.train_step(make_rollout_batch(VOCAB, seed=seed)))
        rates += [metrics["train/lr"], metrics["train/critic_lr"]]
    # 4 updates: warm-up 0.5, 1 x lr; then linear decay to min_lr at the last; the critic at twice those
    assert rates == pytest.approx([1e-3, 2e-3, 1e-4, 2e-4])


def test_values_without_a_critic_is_an_error(model_dir, tmp_path):
    config = testing.make_config(plasmid_megatron.plugin, plasmid_grpo.plugin, trainer="megatron",
                                 model=str(model_dir), run_dir=tmp_path / "run")
    loss = testing.build("loss", "grpo", plasmid_grpo.plugin, config=config)
    trainer = testing.build("trainer", "megatron", plasmid_megatron.plugin, config=config, args=(loss,))
    assert trainer.critic is None
    with pytest.raises(ValueError, match="no critic"):
        testing.run(trainer.values(make_rollout_batch(VOCAB).samples))


# ------------------------------------------------------------------------------------------------
# parallel layouts (two processes over gloo) against a single process


def run_layout(model_dir: Path, out: Path, options: dict) -> dict:
    """``critic_worker.py`` as 2 ranks with ``options``; rank 0's result."""
    out.mkdir(parents=True)
    return run_ranks(WORKER, {"model": str(model_dir), "out": str(out), "options": options}, 2)


@pytest.fixture(scope="module")
def single(model_dir, tmp_path_factory):
    return run({"model": str(model_dir), "out": str(tmp_path_factory.mktemp("critic-single"))})


LAYOUTS = {"tp2": {"tensor_model_parallel_size": 2}, "pp2": {"pipeline_model_parallel_size": 2}, "dp2": {},
           "cp2": {"context_parallel_size": 2}}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_critic_layout_matches_a_single_process(layout, model_dir, single, tmp_path):
    """Values before and after one SGD update (they depend on every critic weight), the value loss
    and the critic's gradient norm (replicated parameters counted once under TP) of 2 ranks. With
    context parallelism each rank reads the values of the positions it holds (CPU stand-in for
    TransformerEngine's attention: cp_attention_standin.py)."""
    got = run_layout(model_dir, tmp_path / layout, LAYOUTS[layout])
    for key in ("values", "values_after"):
        for values, reference in zip(got[key], single[key], strict=True):
            assert np.allclose(values, reference, atol=1e-5, rtol=0), key
    assert set(got["step"]) == set(single["step"])
    for name, value in single["step"].items():
        assert got["step"][name] == pytest.approx(value, rel=1e-4, abs=1e-6), name


# ------------------------------------------------------------------------------------------------


class TestMegatronPpoContract(TrainerContract):
    """The trainer contract holds with a critic, too."""

    plugin = plasmid_megatron.plugin
    provider = "megatron"
    loss_plugin = plasmid_ppo.plugin
    loss_provider = "ppo"
    config_options = {"trainer": "megatron"}
