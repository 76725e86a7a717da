"""The contract every trainer provider satisfies (imports torch and transformers).

Subclass it in the plugin's tests, naming the plugin module and the provider::

    class TestMyTrainer(TrainerContract):
        plugin = my_trainer.plugin
        provider = "my-trainer"
        model_options = {"arch": "llama"}   # optional: build_tiny_model keywords
        config_options = {"lr": 1e-3}       # optional: options to build the trainer with
        contract_loss = ContractLoss(kl_coef=0.05)   # optional: the loss, here with a reference model
        # or a plugin's loss instead: loss_plugin = plasmid_grpo.plugin; loss_provider = "grpo"

The trainer trains a tiny model built with :func:`plasmid_torch.tiny.build_tiny_model` on batches
made by hand (:func:`make_rollout_batch`), with a loss of this module (:class:`ContractLoss`,
:class:`ContractCriticLoss`: test support, so the contract needs no loss plugin) unless
``loss_plugin`` names one. The trainer plugin declares the trainers' shared options
(:class:`plasmid_torch.trainer_options.TrainerOptions`). What it checks:

- ``train_step`` returns finite float metrics (with ``train/loss``) and changes the weights;
- ``logprobs`` returns one value per response token, each ``<= 0``;
- ``export_weights`` buckets respect the byte bound (a single larger tensor alone) and cover
  every tensor of the saved Hugging Face checkpoint exactly once, with equal values;
- ``save`` then ``load`` into a fresh trainer restores the log-probs exactly;
- a trainer resumed from a checkpoint takes the same next step as the one that wrote it: every
  metric and weight bit-identical (optimizer, LR schedule and counters restored);
- the checkpoint's ``model/`` directory (:attr:`TrainerContract.checkpoint_model_subdir`) loads
  with ``transformers.AutoModelForCausalLM`` and ``AutoTokenizer.from_pretrained``;
- critic warm-up (``--critic-warmup-steps``): with a loss that trains a critic, the warm-up steps
  leave the policy unchanged and train the critic (:class:`plasmid.protocols.SupportsValues`), the
  next one updates the policy; a loss without a critic ignores the option;
- a bad step is refused (:meth:`plasmid.protocols.Trainer.train_step`): a NaN policy loss
  (:class:`PoisonableLoss`), a NaN critic loss after the policy's update, and ``--lr 1e12`` each
  return ``train/bad_step/<reason>`` = 1.0 with only finite metrics, leave the weights (and the
  critic's values) and the optimizer state (:meth:`TrainerContract.optimizer_state`) bit-identical,
  and the next good step is bit for bit the one of a trainer that never saw the bad one.

Images (opt-in): a trainer that takes samples with images claims it with ``multimodal = True``; it is
then built on the tiny Qwen2-VL (:func:`plasmid_torch.tiny_vision.build_tiny_vlm`) and given samples
as the data sources make them (:mod:`plasmid_torch.testing.images`: the image tokens expanded, a JSON
reference in ``metadata[VISION_KEY]``) with responses sampled by the engines' image path
(:func:`plasmid_torch.vision.generate`). Checked: its log-probs agree with the ones sampling reported
within :attr:`TrainerContract.image_logprob_atol` (the text path's bound on
``train/train_rollout_logprob_abs_diff``) and change when a sample's image is swapped for another; a
train step with images returns finite metrics and moves the vision tower's weights.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from plasmid import testing
from plasmid.config import Config
from plasmid.protocols import BAD_STEP_PREFIX, SupportsValues, Trainer
from plasmid.types import Group, LossBatch, RolloutBatch, Sample
from plasmid_torch.hf import load_causal_lm
from plasmid_torch.testing.batches import make_rollout_batch as make_rollout_batch  # re-exported (tests import it here)
from plasmid_torch.testing.images import BLUE, RED, image_samples, respond, with_image_of
from plasmid_torch.tiny import build_tiny_model
from plasmid_torch.vision import ImageInputs


def tensor_nbytes(tensor: Any) -> int:
    """Bytes of a ``torch.Tensor`` or ``numpy.ndarray``'s data."""
    if isinstance(tensor, np.ndarray):
        return int(tensor.nbytes)
    return int(tensor.numel() * tensor.element_size())


def as_numpy(tensor: torch.Tensor | np.ndarray) -> np.ndarray:
    """A numpy view or copy of a torch tensor; bfloat16 (which numpy lacks) as float32, exactly."""
    if isinstance(tensor, np.ndarray):
        return tensor
    tensor = tensor.detach().cpu()
    return (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).numpy()


def exported(trainer: Any, bucket_bytes: int = 1 << 40) -> dict[str, np.ndarray]:
    """Every tensor ``trainer.export_weights`` yields, as numpy copies by name."""
    return {name: as_numpy(tensor).copy() for bucket in trainer.export_weights(bucket_bytes) for name, tensor in bucket}


# -------------------------------------------------------------------------------------------------
# TEST SUPPORT: the contract's own losses (not RL algorithms to train with)
# -------------------------------------------------------------------------------------------------


class ContractLoss:
    """TEST SUPPORT: the smallest policy-gradient loss that satisfies :class:`plasmid.protocols.Loss`,
    so that the trainer contract needs no loss plugin. Not an algorithm to train with.

    - advantages: each sample's reward minus its group's mean reward, on every trained token;
    - policy loss: ``-sum(ratio * advantage) / total_tokens`` over trained tokens, with
      ``ratio = exp(logprobs - old_logprobs)`` (1 at the first update, where the gradient is the
      plain policy gradient); with ``kl_coef > 0``, plus ``kl_coef * sum((logprobs - ref)^2 / 2) /
      total_tokens`` (and ``needs_ref`` is true: the trainer keeps a reference model);
    - metrics (summed over micro-batches, like the loss): ``pg_loss``, ``entropy`` and ``kl``.

    Built as ``ContractLoss()`` or, as a registered provider would be, ``ContractLoss(config)``.
    """

    needs_critic = False
    needs_old_logprobs = True

    def __init__(self, config: Config | None = None, *, kl_coef: float = 0.0) -> None:
        self.kl_coef = kl_coef
        self.needs_ref = kl_coef > 0

    def advantages(self, batch: LossBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        rewards = batch.rewards.float()
        groups = batch.group_index
        group_sum = torch.zeros_like(rewards).index_add_(0, groups, rewards)
        group_size = torch.zeros_like(rewards).index_add_(0, groups, torch.ones_like(rewards))
        relative = rewards - (group_sum / group_size.clamp(min=1))[groups]
        return relative.unsqueeze(1) * batch.response_mask, None

    def policy_loss(self, batch: LossBatch, logprobs: torch.Tensor,
                    entropy: torch.Tensor | None) -> tuple[torch.Tensor, dict[str, float]]:
        trained = batch.response_mask > 0
        zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
        total = max(int(batch.total_tokens), 1)
        ratio = torch.exp(torch.where(trained, logprobs - batch.old_logprobs, zero))
        pg_loss = -torch.where(trained, ratio * batch.advantages, zero).sum() / total
        loss, metrics = pg_loss, {"pg_loss": float(pg_loss.detach())}
        if self.needs_ref:
            kl = torch.where(trained, (logprobs - batch.ref_logprobs) ** 2 / 2, zero).sum() / total
            loss = loss + self.kl_coef * kl
            metrics["kl"] = float(kl.detach())
        if entropy is not None:
            metrics["entropy"] = float(torch.where(trained, entropy.detach(), zero).sum()) / total
        return loss, metrics


class ContractCriticLoss(ContractLoss):
    """TEST SUPPORT: :class:`ContractLoss` with a critic (a :class:`plasmid.protocols.CriticLoss`).

    - returns: each sample's reward on every trained token (no discount);
    - advantages: ``returns - values`` (the critic's values before the update);
    - value loss: ``sum((values - returns)^2 / 2) / total_tokens`` over trained tokens; metric
      ``value_loss``.
    """

    needs_critic = True

    def advantages(self, batch: LossBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        returns = batch.rewards.float().unsqueeze(1) * batch.response_mask
        return (returns - batch.values) * batch.response_mask, returns

    def value_loss(self, batch: LossBatch, values: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        trained = batch.response_mask > 0
        zero = torch.zeros((), dtype=values.dtype, device=values.device)
        loss = torch.where(trained, (values - batch.returns) ** 2 / 2, zero).sum() / max(int(batch.total_tokens), 1)
        return loss, {"value_loss": float(loss.detach())}


class PoisonableLoss(ContractLoss):
    """TEST SUPPORT: :class:`ContractLoss` whose policy loss is NaN (gradients too) while ``poisoned``."""

    poisoned = False

    def policy_loss(self, batch: LossBatch, logprobs: torch.Tensor,
                    entropy: torch.Tensor | None) -> tuple[torch.Tensor, dict[str, float]]:
        loss, metrics = super().policy_loss(batch, logprobs, entropy)
        return (loss * math.nan, metrics) if self.poisoned else (loss, metrics)


class PoisonableCriticLoss(ContractCriticLoss):
    """TEST SUPPORT: :class:`ContractCriticLoss` whose value loss is NaN while ``poisoned``."""

    poisoned = False

    def value_loss(self, batch: LossBatch, values: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        loss, metrics = super().value_loss(batch, values)
        return (loss * math.nan, metrics) if self.poisoned else (loss, metrics)


def torch_optimizers(holder: Any) -> list[torch.optim.Optimizer]:
    """The ``torch.optim.Optimizer`` s behind ``holder``'s attributes named ``*optimizer*`` (and its
    ``critic``'s): torch's own, or inside megatron's (``chained_optimizers``, ``optimizer``)."""
    def unwrap(value: Any) -> list[torch.optim.Optimizer]:
        if isinstance(value, torch.optim.Optimizer):
            return [value]
        chained = getattr(value, "chained_optimizers", None)
        if chained is not None:
            return [inner for part in chained for inner in unwrap(part)]
        inner = vars(value).get("optimizer") if hasattr(value, "__dict__") else None
        return unwrap(inner) if inner is not None else []

    holders = [holder]
    critic = getattr(holder, "critic", None)
    if critic is not None and not isinstance(critic, torch.nn.Module):
        holders.append(critic)
    return [optimizer for one in holders for name, value in sorted(vars(one).items()) if "optimizer" in name
            for optimizer in unwrap(value)]


def optimizer_tensors(optimizers: list[torch.optim.Optimizer]) -> dict[str, np.ndarray]:
    """Every parameter, state tensor and param-group setting of ``optimizers``, by position."""
    found: dict[str, np.ndarray] = {}
    for o, optimizer in enumerate(optimizers):
        for g, group in enumerate(optimizer.param_groups):
            for name, value in group.items():
                if name != "params" and isinstance(value, (int, float)):
                    found[f"{o}.{g}.{name}"] = np.array(value)
            for p, parameter in enumerate(group["params"]):
                found[f"{o}.{g}.{p}"] = as_numpy(parameter).copy()
                for name, value in sorted(optimizer.state.get(parameter, {}).items()):
                    found[f"{o}.{g}.{p}.{name}"] = as_numpy(torch.as_tensor(value)).copy()
    return found


def differing(before: dict[str, np.ndarray], after: dict[str, np.ndarray]) -> list[str]:
    """Names missing on one side or whose arrays are not bit-identical."""
    return sorted(set(before) ^ set(after)) + [name for name in sorted(set(before) & set(after))
                                               if not np.array_equal(before[name], after[name])]


def bad_reasons(metrics: dict[str, float]) -> list[str]:
    """The ``train/bad_step/<reason>`` reasons in ``metrics``."""
    return sorted(name.removeprefix(BAD_STEP_PREFIX) for name in metrics if name.startswith(BAD_STEP_PREFIX))


def without_time(metrics: dict[str, float]) -> dict[str, float]:
    """``metrics`` without the wall-clock ones (``*seconds*``)."""
    return {name: value for name, value in metrics.items() if "seconds" not in name}


class TrainerContract:
    """Checks for a trainer provider; subclasses set ``plugin`` and ``provider``."""

    plugin: Any = None
    provider: str = ""
    #: the loss the trainer is built with (unless ``loss_plugin`` is set)
    contract_loss: Any = ContractLoss()
    #: a loss plugin to build ``loss_provider`` from instead of :attr:`contract_loss`
    loss_plugin: Any = None
    loss_provider: str = ""
    config_options: dict[str, Any] = {}
    model_options: dict[str, Any] = {}
    #: where a checkpoint keeps its Hugging Face model directory, relative to the checkpoint
    checkpoint_model_subdir: str = "model"
    #: whether the trainer takes samples with images (module docs); the image checks skip otherwise
    multimodal: bool = False
    #: how far its log-probs of responses to prompts with images may be from the sampler's
    image_logprob_atol: float = 1e-4

    @pytest.fixture(scope="class")
    @classmethod
    def model_dir(cls, tmp_path_factory: Any) -> Path:
        return build_tiny_model(tmp_path_factory.mktemp("trainer-contract") / "tiny", **cls.model_options)

    @pytest.fixture
    def vocab_size(self, model_dir: Path) -> int:
        return int(json.loads((model_dir / "config.json").read_text())["vocab_size"])

    @pytest.fixture
    def make_trainer(self, model_dir: Path, tmp_path: Path) -> Any:
        """``make_trainer(loss=None, **options)``: a fresh trainer on the tiny model, with ``loss``
        (default: :attr:`contract_loss`, or ``loss_provider`` of ``loss_plugin`` when that is set)."""
        plugins = (self.plugin,) if self.loss_plugin is None else (self.plugin, self.loss_plugin)

        def factory(loss: Any = None, **options: Any) -> Any:
            merged = {"lr": 1e-3, "model": str(model_dir), "run_dir": tmp_path / "run", **self.config_options,
                      **options}
            config = testing.make_config(*plugins, **merged)
            if loss is None and self.loss_plugin is not None:
                loss = testing.build("loss", self.loss_provider, *plugins, config=config)
            elif loss is None:
                loss = self.contract_loss
            return testing.build("trainer", self.provider, *plugins, config=config, args=(loss,))

        return factory

    @pytest.fixture
    def trainer(self, make_trainer: Any) -> Any:
        return make_trainer()

    # ---------------------------------------------------------------------------------------------

    def test_is_a_trainer(self, trainer: Any) -> None:
        assert isinstance(trainer, Trainer)

    def test_train_step_returns_finite_metrics_and_changes_the_weights(self, trainer: Any, vocab_size: int) -> None:
        before = exported(trainer)
        metrics = testing.run(trainer.train_step(make_rollout_batch(vocab_size)))
        assert "train/loss" in metrics
        for name, value in metrics.items():
            assert isinstance(value, float) and math.isfinite(value), f"{name} = {value!r}"
        after = exported(trainer)
        assert set(after) == set(before)
        changed = [name for name in before if not np.array_equal(before[name], after[name])]
        assert changed, "train_step did not change any weight"

    def test_logprobs_have_one_nonpositive_value_per_response_token(self, trainer: Any, vocab_size: int) -> None:
        samples = make_rollout_batch(vocab_size).samples
        values = testing.run(trainer.logprobs(samples, 1.0))
        assert [len(v) for v in values] == [s.response_length for s in samples]
        assert all(math.isfinite(x) and x <= 0 for v in values for x in v)

    def test_export_buckets_respect_the_bound_and_cover_the_checkpoint(self, trainer: Any, tmp_path: Path) -> None:
        sizes = sorted(tensor_nbytes(t) for bucket in trainer.export_weights(1 << 40) for _, t in bucket)
        bound = sizes[len(sizes) // 2] * 3          # some buckets hold several tensors, some one
        buckets = list(trainer.export_weights(bound))
        assert len(buckets) > 1
        for bucket in buckets:
            assert bucket, "an empty bucket"
            total = sum(tensor_nbytes(t) for _, t in bucket)
            assert total <= bound or len(bucket) == 1, f"a bucket of {total} bytes > {bound} holds {len(bucket)}"
        names = [name for bucket in buckets for name, _ in bucket]
        assert len(names) == len(set(names)), "a tensor was exported twice"

        testing.run(trainer.save(str(tmp_path / "ckpt")))
        from safetensors.numpy import load_file

        saved: dict[str, np.ndarray] = {}
        for file in (tmp_path / "ckpt" / self.checkpoint_model_subdir).glob("*.safetensors"):
            saved.update(load_file(str(file)))
        assert set(names) == set(saved), f"exported {sorted(set(names) ^ set(saved))} differ from the checkpoint"
        weights = exported(trainer)
        for name, value in saved.items():
            assert np.array_equal(weights[name], value), name

    def test_save_then_load_restores_logprobs_exactly(self, make_trainer: Any, vocab_size: int, tmp_path: Path) -> None:
        trained = make_trainer()
        testing.run(trained.train_step(make_rollout_batch(vocab_size, seed=1)))
        samples = make_rollout_batch(vocab_size, seed=2).samples
        expected = testing.run(trained.logprobs(samples, 1.0))
        testing.run(trained.save(str(tmp_path / "ckpt")))

        fresh = make_trainer()
        assert testing.run(fresh.logprobs(samples, 1.0)) != expected, "training changed no log-prob"
        testing.run(fresh.load(str(tmp_path / "ckpt")))
        assert testing.run(fresh.logprobs(samples, 1.0)) == expected

    def test_checkpoint_loads_with_transformers(self, trainer: Any, vocab_size: int, model_dir: Path,
                                                tmp_path: Path) -> None:
        import transformers

        testing.run(trainer.train_step(make_rollout_batch(vocab_size)))
        testing.run(trainer.save(str(tmp_path / "ckpt")))
        directory = tmp_path / "ckpt" / self.checkpoint_model_subdir
        model = transformers.AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32)
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
        original = transformers.AutoTokenizer.from_pretrained(str(model_dir))
        assert tokenizer.get_vocab() == original.get_vocab(), "the checkpoint's tokenizer is not --model's"
        state = {name: tensor.numpy() for name, tensor in model.state_dict().items()}
        for name, value in exported(trainer).items():
            assert np.array_equal(state[name], value), name

    def test_a_resumed_trainer_takes_the_same_next_step_bit_for_bit(self, make_trainer: Any, vocab_size: int,
                                                                    tmp_path: Path) -> None:
        options = {"lr_schedule": "cosine", "lr_warmup_steps": 1, "num_rollouts": 3}
        straight = make_trainer(**options)
        testing.run(straight.train_step(make_rollout_batch(vocab_size, seed=1)))
        testing.run(straight.save(str(tmp_path / "ckpt")))
        expected = without_time(testing.run(straight.train_step(make_rollout_batch(vocab_size, seed=2,
                                                                                   rollout_id=1))))
        expected_weights = exported(straight)

        resumed = make_trainer(**options)
        testing.run(resumed.load(str(tmp_path / "ckpt")))
        got = without_time(testing.run(resumed.train_step(make_rollout_batch(vocab_size, seed=2, rollout_id=1))))
        assert got == expected, {name: (expected.get(name), got.get(name)) for name in set(expected) | set(got)
                                 if expected.get(name) != got.get(name)}
        weights = exported(resumed)
        assert set(weights) == set(expected_weights)
        differing = [name for name, value in expected_weights.items() if not np.array_equal(weights[name], value)]
        assert not differing, f"the resumed trainer's weights differ: {differing}"

    def test_critic_warmup_trains_only_the_critic_then_the_policy(self, make_trainer: Any, vocab_size: int) -> None:
        trainer: Trainer = make_trainer(loss=ContractCriticLoss(), critic_warmup_steps=1)
        assert isinstance(trainer, SupportsValues), "a trainer built with a critic loss must have values()"
        probe = make_rollout_batch(vocab_size, seed=3).samples
        policy_before, values_before = exported(trainer), testing.run(trainer.values(probe))

        metrics = testing.run(trainer.train_step(make_rollout_batch(vocab_size, seed=1)))
        assert metrics["train/policy_updated"] == 0.0 and metrics["train/updates"] == 0.0
        moved = [name for name, value in exported(trainer).items() if not np.array_equal(policy_before[name], value)]
        assert not moved, f"the policy moved during the critic warm-up: {moved}"
        assert testing.run(trainer.values(probe)) != values_before, "the critic did not train during warm-up"

        metrics = testing.run(trainer.train_step(make_rollout_batch(vocab_size, seed=2, rollout_id=1)))
        assert metrics["train/policy_updated"] == 1.0 and metrics["train/updates"] >= 1.0
        assert any(not np.array_equal(policy_before[name], value) for name, value in exported(trainer).items())

    def test_a_loss_without_a_critic_ignores_the_critic_warmup(self, make_trainer: Any, vocab_size: int) -> None:
        trainer = make_trainer(loss=ContractLoss(), critic_warmup_steps=3)
        before = exported(trainer)
        metrics = testing.run(trainer.train_step(make_rollout_batch(vocab_size)))
        assert metrics["train/updates"] == 1.0
        assert any(not np.array_equal(before[name], value) for name, value in exported(trainer).items()), \
            "a loss without a critic has no warm-up: the first step must update the policy"

    # ---------------------------------------------------------------------------------------------
    # bad steps

    def optimizer_state(self, trainer: Any) -> dict[str, np.ndarray]:
        """The trainer's optimizer state as arrays (default: :func:`optimizer_tensors` of
        :func:`torch_optimizers`); a trainer whose optimizers those do not find overrides this."""
        found = optimizer_tensors(torch_optimizers(trainer))
        assert found, f"no optimizer state found on {type(trainer).__name__}: override optimizer_state"
        return found

    def _assert_refused(self, trainer: Any, metrics: dict[str, float], reasons: set[str],
                        weights: dict[str, np.ndarray], state: dict[str, np.ndarray]) -> None:
        got = bad_reasons(metrics)
        assert got and set(got) <= reasons, f"expected a bad-step metric in {sorted(reasons)}, got {got}"
        assert all(metrics[BAD_STEP_PREFIX + reason] == 1.0 for reason in got)
        for name, value in metrics.items():
            assert isinstance(value, float) and math.isfinite(value), f"{name} = {value!r}"
        assert not differing(weights, exported(trainer)), "a refused step changed the weights"
        assert not differing(state, self.optimizer_state(trainer)), "a refused step changed the optimizer state"

    def test_a_nan_loss_refuses_the_step_and_the_next_one_trains_as_if_it_never_came(
            self, make_trainer: Any, vocab_size: int) -> None:
        options = {"lr_schedule": "cosine", "lr_warmup_steps": 1, "num_rollouts": 4}
        loss = PoisonableLoss()
        trainer, twin = make_trainer(loss=loss, **options), make_trainer(loss=PoisonableLoss(), **options)
        for one in (trainer, twin):
            testing.run(one.train_step(make_rollout_batch(vocab_size, seed=1)))
        weights, state = exported(trainer), self.optimizer_state(trainer)
        counters = (getattr(trainer, "steps", None), getattr(trainer, "updates", None))

        loss.poisoned = True
        metrics = testing.run(trainer.train_step(make_rollout_batch(vocab_size, seed=2, rollout_id=1)))
        self._assert_refused(trainer, metrics, {"nonfinite_loss", "nonfinite_grad_norm"}, weights, state)
        assert (getattr(trainer, "steps", None), getattr(trainer, "updates", None)) == counters

        loss.poisoned = False
        batch = make_rollout_batch(vocab_size, seed=3, rollout_id=1)
        got, want = (without_time(testing.run(one.train_step(batch))) for one in (trainer, twin))
        assert got == want, {name: (want.get(name), got.get(name)) for name in set(want) | set(got)
                             if want.get(name) != got.get(name)}
        assert not differing(exported(twin), exported(trainer)), "the step after a refused one differs"
        assert not differing(self.optimizer_state(twin), self.optimizer_state(trainer))

    def test_a_nan_critic_loss_refuses_the_step_and_undoes_the_policy_update(self, make_trainer: Any,
                                                                             vocab_size: int) -> None:
        loss = PoisonableCriticLoss()
        trainer = make_trainer(loss=loss, max_update_ratio=0)     # the restore, not the weight check
        testing.run(trainer.train_step(make_rollout_batch(vocab_size, seed=1)))
        probe = make_rollout_batch(vocab_size, seed=3).samples
        weights, state, values = exported(trainer), self.optimizer_state(trainer), testing.run(trainer.values(probe))

        loss.poisoned = True
        metrics = testing.run(trainer.train_step(make_rollout_batch(vocab_size, seed=2, rollout_id=1)))
        self._assert_refused(trainer, metrics, {"critic_nonfinite_loss", "critic_nonfinite_grad_norm"}, weights,
                             state)
        assert testing.run(trainer.values(probe)) == values, "a refused step changed the critic"

    def test_a_huge_learning_rate_step_is_refused_with_the_weights_as_they_were(self, make_trainer: Any,
                                                                                vocab_size: int) -> None:
        trainer, fresh = make_trainer(lr=1e12), make_trainer(lr=1e12)
        weights, state = exported(trainer), self.optimizer_state(trainer)
        metrics = testing.run(trainer.train_step(make_rollout_batch(vocab_size)))
        self._assert_refused(trainer, metrics, {"weights_blew_up", "nonfinite_weights"}, weights, state)
        assert not differing(self.optimizer_state(fresh), self.optimizer_state(trainer))
        assert testing.run(trainer.logprobs(make_rollout_batch(vocab_size, seed=2).samples, 1.0)) == \
            testing.run(fresh.logprobs(make_rollout_batch(vocab_size, seed=2).samples, 1.0))

    # ---------------------------------------------------------------------------------------------
    # Images (opt-in: multimodal = True)
    # ---------------------------------------------------------------------------------------------

    @pytest.fixture(scope="class")
    @classmethod
    def vlm_dir(cls, tmp_path_factory: Any) -> Path:
        """The tiny Qwen2-VL; skips the test unless :attr:`multimodal`."""
        if not cls.multimodal:
            pytest.skip("set multimodal = True to claim samples with images")
        from plasmid_torch.tiny_vision import build_tiny_vlm

        return build_tiny_vlm(tmp_path_factory.mktemp("trainer-contract") / "vlm", seed=0)

    @pytest.fixture(scope="class")
    @classmethod
    def image_batch(cls, vlm_dir: Path) -> list[Group]:
        """Two groups (a red and a blue image) of two samples each, answered by the tiny VLM's sampling
        path with their ``rollout_logprobs``; rewards 1, 0 in each group."""
        model, images = load_causal_lm(str(vlm_dir)), ImageInputs(str(vlm_dir))
        samples = [respond(model, images, sample, seed=sample.index)
                   for sample in image_samples(vlm_dir, [RED, BLUE], per_prompt=2)]
        for sample in samples:
            sample.reward = float(sample.index % 2 == 0)
        return [Group([s for s in samples if s.group_index == group], group) for group in (0, 1)]

    @staticmethod
    def copies(groups: list[Group]) -> list[Sample]:
        """Fresh copies of the samples of ``groups`` (a trainer may write to the samples it is given)."""
        return [Sample(prompt=s.prompt, tokens=list(s.tokens), response_length=s.response_length,
                       loss_mask=list(s.loss_mask or []), rollout_logprobs=list(s.rollout_logprobs or []),
                       reward=s.reward, metadata=dict(s.metadata), index=s.index, group_index=s.group_index)
                for group in groups for s in group.samples]

    def test_logprobs_with_images_agree_with_the_samplers_and_depend_on_the_images(
            self, vlm_dir: Path, make_trainer: Any, image_batch: list[Group]) -> None:
        trainer = make_trainer(model=str(vlm_dir))
        samples = self.copies(image_batch)
        values = testing.run(trainer.logprobs(samples, 1.0))
        assert [len(v) for v in values] == [s.response_length for s in samples]
        for sample, value in zip(samples, values, strict=True):
            np.testing.assert_allclose(value, sample.rollout_logprobs or [], rtol=0, atol=self.image_logprob_atol,
                                       err_msg=f"sample {sample.index}: the trainer's log-probs with its image")
        red, blue = samples[0], samples[2]
        swapped = testing.run(trainer.logprobs([with_image_of(red, blue), with_image_of(blue, red)], 1.0))
        for original, other in zip((values[0], values[2]), swapped, strict=True):
            assert not np.allclose(original, other, rtol=0, atol=1e-3), "another image left the log-probs as they were"

    def test_a_train_step_with_images_moves_the_vision_tower(self, vlm_dir: Path, make_trainer: Any,
                                                             image_batch: list[Group]) -> None:
        trainer = make_trainer(model=str(vlm_dir))
        before = exported(trainer)
        samples = self.copies(image_batch)
        groups = [Group([s for s in samples if s.group_index == group.index], group.index) for group in image_batch]
        metrics = testing.run(trainer.train_step(RolloutBatch(rollout_id=0, groups=groups)))
        assert not bad_reasons(metrics), f"the step was refused: {bad_reasons(metrics)}"
        for name, value in metrics.items():
            assert isinstance(value, float) and math.isfinite(value), f"{name} = {value!r}"
        after = exported(trainer)
        tower = [name for name in before if ".visual." in f".{name}"]
        assert tower, "no exported tensor of the vision tower (.visual.)"
        assert any(not np.array_equal(before[name], after[name]) for name in tower), \
            "a step on samples with images left the vision tower as it was"
