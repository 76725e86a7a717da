"""The contract every trainer provider satisfies (imports torch and transformers).

Subclass it in the plugin's tests, naming the plugin module and the provider::

    class TestMyTrainer(TrainerContract):
        plugin = my_trainer.plugin
        provider = "my-trainer"
        loss_plugin = plasmid_grpo.plugin   # default: plasmid-grpo's plugin, when installed
        loss_provider = "grpo"
        model_options = {"arch": "llama"}   # optional: build_tiny_model keywords
        config_options = {"lr": 1e-3}       # optional: options to build the trainer with

The trainer trains a tiny model built with :func:`plasmid_torch.tiny.build_tiny_model` on batches
made by hand (:func:`make_rollout_batch`). What it checks:

- ``train_step`` returns finite float metrics (with ``train/loss``) and changes the weights;
- ``logprobs`` returns one value per response token, each ``<= 0``;
- ``export_weights`` buckets respect the byte bound (a single larger tensor alone) and cover
  every tensor of the saved Hugging Face checkpoint exactly once, with equal values;
- ``save`` then ``load`` into a fresh trainer restores the log-probs exactly;
- the checkpoint's ``model/`` directory (:attr:`TrainerContract.checkpoint_model_subdir`) loads
  with ``transformers.AutoModelForCausalLM`` and ``AutoTokenizer.from_pretrained``.
"""

from __future__ import annotations

import importlib
import json
import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from plasmid import testing
from plasmid.protocols import Trainer
from plasmid.types import Group, RolloutBatch, Sample, Status
from plasmid_torch.tiny import BOS_ID, SPECIAL_TOKENS, build_tiny_model


def make_rollout_batch(vocab_size: int, *, groups: int = 2, group_size: int = 4, seed: int = 0,
                       rollout_id: int = 0) -> RolloutBatch:
    """A scored :class:`RolloutBatch` of random prompts and responses drawn from ``vocab_size``.

    Rewards alternate 1, 0 within each group (every group has advantages); responses have
    different lengths, and every third one has a masked tool-output token. ``rollout_logprobs``
    are left unset: fill them from an engine or trainer when a test needs them.
    """
    rng = random.Random(seed)
    first_regular = len(SPECIAL_TOKENS)
    made = []
    for group_index in range(groups):
        prompt = [BOS_ID] + [rng.randrange(first_regular, vocab_size) for _ in range(rng.randint(2, 5))]
        samples = []
        for k in range(group_size):
            response = [rng.randrange(first_regular, vocab_size) for _ in range(rng.randint(2, 6))]
            loss_mask = [1] * len(response)
            if (group_index * group_size + k) % 3 == 1:
                loss_mask[1] = 0
            samples.append(Sample(prompt="", tokens=prompt + response, response_length=len(response),
                                  loss_mask=loss_mask, reward=float((k + 1) % 2), status=Status.COMPLETED,
                                  index=group_index * group_size + k, group_index=group_index, weight_version=0))
        made.append(Group(samples=samples, index=group_index))
    return RolloutBatch(rollout_id=rollout_id, groups=made)


def tensor_nbytes(tensor: Any) -> int:
    """Bytes of a ``torch.Tensor`` or ``numpy.ndarray``'s data."""
    if isinstance(tensor, np.ndarray):
        return int(tensor.nbytes)
    return int(tensor.numel() * tensor.element_size())


def as_numpy(tensor: Any) -> np.ndarray:
    """A numpy view or copy of a torch tensor; bfloat16 (which numpy lacks) as float32, exactly."""
    if isinstance(tensor, np.ndarray):
        return tensor
    tensor = tensor.detach().cpu()
    return (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).numpy()


def exported(trainer: Any, bucket_bytes: int = 1 << 40) -> dict[str, np.ndarray]:
    """Every tensor ``trainer.export_weights`` yields, as numpy copies by name."""
    return {name: as_numpy(tensor).copy() for bucket in trainer.export_weights(bucket_bytes) for name, tensor in bucket}


def default_loss_plugin() -> Any:
    try:
        return importlib.import_module("plasmid_grpo.plugin")
    except ImportError:
        pytest.skip("the trainer contract needs a loss: install plasmid-grpo or set loss_plugin/loss_provider")


class TrainerContract:
    """Checks for a trainer provider; subclasses set ``plugin`` and ``provider``."""

    plugin: Any = None
    provider: str = ""
    loss_plugin: Any = None
    loss_provider: str = "grpo"
    config_options: dict[str, Any] = {}
    model_options: dict[str, Any] = {}
    #: where a checkpoint keeps its Hugging Face model directory, relative to the checkpoint
    checkpoint_model_subdir: str = "model"

    @pytest.fixture(scope="class")
    @classmethod
    def model_dir(cls, tmp_path_factory: Any) -> Path:
        return build_tiny_model(tmp_path_factory.mktemp("trainer-contract") / "tiny", **cls.model_options)

    @pytest.fixture
    def vocab_size(self, model_dir: Path) -> int:
        return int(json.loads((model_dir / "config.json").read_text())["vocab_size"])

    @pytest.fixture
    def make_trainer(self, model_dir: Path, tmp_path: Path) -> Any:
        """``make_trainer(**options)``: a fresh trainer (and its loss) on the tiny model."""
        loss_plugin = self.loss_plugin or default_loss_plugin()

        def factory(**options: Any) -> Any:
            merged = {"lr": 1e-3, "model": str(model_dir), "run_dir": tmp_path / "run", **self.config_options,
                      **options}
            config = testing.make_config(self.plugin, loss_plugin, **merged)
            loss = testing.build("loss", self.loss_provider, self.plugin, loss_plugin, config=config)
            return testing.build("trainer", self.provider, self.plugin, loss_plugin, config=config, args=(loss,))

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
