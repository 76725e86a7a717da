"""The contract every weight-sync provider satisfies (imports torch).

A weight sync moves weights between two other providers, so the subclass says how to build
them, from a configuration whose ``--model`` is a tiny model built here::

    class TestInProcess(WeightSyncContract):
        plugin = plasmid_sync.plugin
        provider = "inprocess"
        extra_plugins = (plasmid_torchtrain.plugin, plasmid_grpo.plugin, plasmid_torchgen.plugin)

        def make_trainer(self, config):
            ...                                # a Trainer on --model

        def make_engines(self, config, count):
            ...                                # `count` RolloutEngines on --model

What it checks, after the trainer has taken one training step (so its weights differ from the
engines'):

- every engine's weights (``engine.get_weights``) equal the trainer's exported tensors bit for
  bit, and the engine's ``weight_version`` is the version passed to ``sync``;
- the engine's ``response_logprobs`` of fixed sequences matches the trainer's ``logprobs`` within
  :attr:`WeightSyncContract.logprob_tolerance`;
- the report's ``bytes`` is the sum of the exported tensors' bytes, ``buckets`` the number of
  buckets of ``--update-weight-buffer-size`` bytes, and ``weight_version`` the version passed.
  A sync that compresses (``compresses = True``) reports the bytes it wrote instead, and the
  exported tensors' bytes as ``report.metrics["sync/raw_bytes"]``.

Trainer and engines may be proxies for providers in other processes (a runtime's, such as the
Ray runtime's actors): the contract only calls protocol methods on them. Override :meth:`close`
to also end what :meth:`make_trainer` started.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from plasmid import testing
from plasmid.config import Config
from plasmid.kernel_options import GeneralOptions
from plasmid.protocols import RolloutEngine, Trainer, WeightSync
from plasmid.providers import adopt_legacy_score
from plasmid.types import Sample
from plasmid_torch.testing.batches import make_rollout_batch
from plasmid_torch.testing.contracts.trainer import as_numpy, exported, tensor_nbytes
from plasmid_torch.tiny import build_tiny_model


@dataclass
class SyncSetup:
    """What one contract test works on."""

    config: Config
    sync: WeightSync
    trainer: Trainer
    engines: list[RolloutEngine]


class WeightSyncContract:
    """Checks for a weight-sync provider; subclasses set ``plugin`` and ``provider`` and
    implement :meth:`make_trainer` and :meth:`make_engines`."""

    plugin: Any = None
    provider: str = ""
    #: plugin modules whose options the configuration needs (trainer, loss, engine)
    extra_plugins: tuple[Any, ...] = ()
    config_options: dict[str, Any] = {}
    model_options: dict[str, Any] = {}
    engine_count: int = 2
    #: bytes per bucket: small enough that the tiny model takes several buckets
    bucket_bytes: int = 40_000
    logprob_tolerance: float = 1e-4
    #: the sync compresses: ``report.bytes`` counts what it wrote, ``sync/raw_bytes`` the tensors
    compresses: bool = False
    #: the sync lets engines serve the trainer's own tensors (``inprocess`` by default): nothing is
    #: moved (``report.bytes`` and ``buckets`` 0), ``sync/shared_bytes`` counts the tensors shared
    shares: bool = False

    def make_trainer(self, config: Config) -> Trainer:
        """A :class:`plasmid.protocols.Trainer` on ``--model``."""
        raise NotImplementedError(f"{type(self).__name__} must implement make_trainer(config)")

    def make_engines(self, config: Config, count: int) -> list[RolloutEngine]:
        """``count`` :class:`plasmid.protocols.RolloutEngine` on ``--model``."""
        raise NotImplementedError(f"{type(self).__name__} must implement make_engines(config, count)")

    def close(self, setup: SyncSetup) -> None:
        """End what one test built; by default, shut every engine down."""

        async def shutdown() -> None:
            for engine in setup.engines:
                await engine.shutdown()

        testing.run(shutdown())

    @pytest.fixture(scope="class")
    @classmethod
    def model_dir(cls, tmp_path_factory: Any) -> Path:
        return build_tiny_model(tmp_path_factory.mktemp("weightsync-contract") / "tiny", **cls.model_options)

    @pytest.fixture
    def setup(self, model_dir: Path, tmp_path: Path) -> Any:
        options = {"model": str(model_dir), "run_dir": tmp_path / "run", "lr": 1e-2,
                   "update_weight_buffer_size": self.bucket_bytes, **self.config_options}
        config = testing.make_config(self.plugin, *self.extra_plugins, **options)
        sync = testing.build("weight_sync", self.provider, self.plugin, *self.extra_plugins, config=config)
        engines = [adopt_legacy_score(engine, f"engine of {type(self).__name__}.make_engines")  # deprecated score
                   for engine in self.make_engines(config, self.engine_count)]
        built = SyncSetup(config, sync, self.make_trainer(config), engines)
        yield built
        self.close(built)

    @staticmethod
    def vocab_size(setup: SyncSetup) -> int:
        import json

        model = GeneralOptions.of(setup.config).model
        return int(json.loads((Path(str(model)) / "config.json").read_text())["vocab_size"])

    async def train_then_sync(self, setup: SyncSetup, weight_version: int) -> Any:
        await setup.trainer.train_step(make_rollout_batch(self.vocab_size(setup)))
        return await setup.sync.sync(setup.trainer, setup.engines, weight_version)

    # ---------------------------------------------------------------------------------------------

    def test_engines_hold_the_trainers_weights_bit_for_bit(self, setup: SyncSetup) -> None:
        async def scenario() -> tuple[dict[str, np.ndarray], list[dict[str, Any]], list[dict[str, Any]]]:
            await setup.trainer.train_step(make_rollout_batch(self.vocab_size(setup)))
            weights = exported(setup.trainer)
            before = [await engine.get_weights(list(weights)) for engine in setup.engines]
            await setup.sync.sync(setup.trainer, setup.engines, 1)
            after = [await engine.get_weights(list(weights)) for engine in setup.engines]
            return weights, before, after

        weights, before, after = testing.run(scenario())
        assert any(not np.array_equal(as_numpy(before[0][name]), value) for name, value in weights.items()), \
            "the engine already held the trained weights before the sync: the test would prove nothing"
        for index, served in enumerate(after):
            assert set(served) == set(weights), f"engine {index} did not return every requested tensor"
            for name, value in weights.items():
                got = as_numpy(served[name])
                assert got.dtype == value.dtype and got.shape == value.shape, f"engine {index}: {name}"
                assert np.array_equal(got, value), f"engine {index}: {name} differs from the trainer's"

    def test_engines_serve_the_synced_weight_version(self, setup: SyncSetup) -> None:
        async def scenario() -> list[list[int]]:
            versions = []
            for version in (3, 4):
                await self.train_then_sync(setup, version)
                versions.append([engine.weight_version for engine in setup.engines])
            return versions

        assert testing.run(scenario()) == [[3] * self.engine_count, [4] * self.engine_count]

    @pytest.mark.parametrize("temperature", [1.0, 0.7])
    def test_engine_scores_match_trainer_logprobs(self, setup: SyncSetup, temperature: float) -> None:
        samples = [Sample(tokens=s.tokens, response_length=s.response_length)
                   for s in make_rollout_batch(self.vocab_size(setup), seed=11).samples[:3]]

        async def scenario() -> tuple[list[list[float]], list[list[list[float]]]]:
            await self.train_then_sync(setup, 1)
            expected = await setup.trainer.logprobs(samples, temperature)
            scored = [[await engine.response_logprobs(s.tokens, s.prompt_length, temperature) for s in samples]
                      for engine in setup.engines]
            return expected, scored

        expected, scored = testing.run(scenario())
        for index, per_engine in enumerate(scored):
            for sample, want, got in zip(samples, expected, per_engine, strict=True):
                assert len(got) == sample.response_length
                worst = max(abs(a - b) for a, b in zip(want, got, strict=True))
                assert worst <= self.logprob_tolerance, f"engine {index}: log-probs differ by {worst:.2e}"

    def test_report_counts_bytes_buckets_and_version(self, setup: SyncSetup) -> None:
        report = testing.run(self.train_then_sync(setup, 7))
        buckets = list(setup.trainer.export_weights(self.bucket_bytes))
        exported_bytes = sum(tensor_nbytes(t) for bucket in buckets for _, t in bucket)
        if self.shares:
            assert report.metrics["sync/shared_bytes"] == exported_bytes
            assert report.bytes == report.buckets == 0
        elif self.compresses:
            assert report.metrics["sync/raw_bytes"] == exported_bytes
            assert 0 < report.bytes
        else:
            assert report.bytes == exported_bytes
        assert self.shares or report.buckets == len(buckets) > 1
        assert report.weight_version == 7
        assert math.isfinite(report.seconds) and report.seconds >= 0
