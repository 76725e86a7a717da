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

And that a sync can neither hang nor lie (:mod:`plasmid_torch.sync_guard`):

- a stuck engine (its load never returns: :meth:`WeightSyncContract.hold_engine`, which a
  subclass whose engines live in other processes overrides to block the load there for real)
  makes ``sync`` raise :class:`~plasmid_torch.sync_guard.SyncTimeout` within ``--sync-timeout``
  (:attr:`WeightSyncContract.stuck_timeout`), naming the transport, the engine and its rank;
- an engine that loads something else than it was sent (a value changed in every tensor) is caught
  by ``--verify-sync-every 1``: :class:`~plasmid_torch.sync_guard.SyncMismatch` naming a tensor and
  the transport (engines in this process only: the fault is injected here);
- an engine whose served weights differ in one tensor from what it was sent is caught by the probe
  (``--verify-sync-check probe``, the check of engines that cannot read weights back), and an
  honest sync passes it (engines in this process only);
- an engine that loads through a server of its own and reports loaded checksums (``loaded_checksums``:
  SGLang, vLLM) is caught by them when it loads other values (:meth:`WeightSyncContract.misloading_engine`),
  and an honest sync checks one tensor per bucket and engine (skipped for other engines);
- a bucket corrupted on its way is refused by the receiver's checksums, where the subclass says how
  to corrupt one (:meth:`WeightSyncContract.sync_with_corrupted_bucket`; skipped otherwise).

Trainer and engines may be proxies for providers in other processes (a runtime's, such as the
Ray runtime's actors): the contract only calls protocol methods on them. Override :meth:`close`
to also end what :meth:`make_trainer` started.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from plasmid import testing
from plasmid.config import Config
from plasmid.kernel_options import GeneralOptions
from plasmid.options import option_fields
from plasmid.protocols import RolloutEngine, Trainer, WeightSync
from plasmid.providers import adopt_legacy_score
from plasmid.remote import is_remote
from plasmid.types import Sample
from plasmid_torch.sync_guard import (
    LOADED_TENSORS_PER_BUCKET,
    SyncGuard,
    SyncGuardOptions,
    SyncMismatch,
    SyncTimeout,
    reports_loaded,
)
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
    #: ``--sync-timeout`` of the stuck-engine test: small, as the test waits that long
    stuck_timeout: float = 1.0
    #: further options of the stuck-engine test (a transport's own timeouts, so that the members
    #: left waiting on the stuck engine give up soon after the test)
    stuck_options: dict[str, Any] = {}

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

    def build_setup(self, model_dir: Path, tmp_path: Path, **options: Any) -> SyncSetup:
        """The trainer, engines and sync of one test, with ``options`` over :attr:`config_options`."""
        checks = sorted(set(options) & {spec.name for spec in option_fields(SyncGuardOptions)})
        options = {"model": str(model_dir), "run_dir": tmp_path / "run", "lr": 1e-2,
                   "update_weight_buffer_size": self.bucket_bytes, **self.config_options, **options}
        try:
            config = testing.make_config(self.plugin, *self.extra_plugins, **options)
        except AttributeError as exc:
            if not checks or "no option" not in str(exc):
                raise
            pytest.skip(f"the sync's plugin does not declare {', '.join(checks)}: add "
                        f"plasmid_torch.sync_guard.SyncGuardOptions to its options and guard its phases with SyncGuard")
        sync = testing.build("weight_sync", self.provider, self.plugin, *self.extra_plugins, config=config)
        engines = [adopt_legacy_score(engine, f"engine of {type(self).__name__}.make_engines")  # deprecated score
                   for engine in self.make_engines(config, self.engine_count)]
        return SyncSetup(config, sync, self.make_trainer(config), engines)

    @pytest.fixture
    def setup(self, model_dir: Path, tmp_path: Path) -> Any:
        built = self.build_setup(model_dir, tmp_path)
        yield built
        self.close(built)

    def hold_engine(self, setup: SyncSetup, index: int) -> Callable[[], None]:
        """Make engine ``index`` of ``setup`` stuck in every weight load (the load starts and never
        returns) until the returned function is called. The default puts a :class:`StuckEngine`
        in its place, which only works for an engine of this process: a subclass whose engines
        are proxies of other processes must block the load in the engine's own process (the Ray
        runtime's tests hold it on an event inside the actor); the test is skipped otherwise."""
        engine = setup.engines[index]
        if is_remote(engine):
            pytest.skip(f"engine {index} is a proxy of another process: override hold_engine to block its loads "
                        f"there (a real stuck engine, not a stand-in)")
        setup.engines[index] = StuckEngine(engine)

        def release() -> None:
            setup.engines[index] = engine

        return release

    def misloading_engine(self, setup: SyncSetup, index: int) -> Any:
        """An engine that loads other values than it is sent, to put in place of engine ``index``
        (the tests put the real one back). The default, :class:`MisloadingEngine`, changes what
        reaches ``update_weights``; a subclass whose transport makes the engine load by another path
        (a server's own endpoint) overrides it to change what that path loaded. Skipped for an
        engine of another process (the fault is injected in this one)."""
        engine = setup.engines[index]
        if is_remote(engine):
            self.close(setup)
            pytest.skip("the engine is a proxy of another process: the misloading is injected in this one")
        return MisloadingEngine(engine)

    async def sync_with_corrupted_bucket(self, setup: SyncSetup, weight_version: int) -> Any:
        """Sync ``weight_version`` into ``setup.engines`` with one tensor's bytes changed on the
        way (after the trainer sent them, before an engine loads them); the sync's result. The
        default skips the test: override it where the transport's path can be reached (files on
        disk, a queue)."""
        pytest.skip(f"{type(self).__name__} does not say how to corrupt a bucket in transit "
                    f"(override sync_with_corrupted_bucket)")

    @staticmethod
    def engine_label(setup: SyncSetup, index: int) -> str:
        return f"engine {index} ({type(setup.engines[index]).__name__}, rank {index + 1})"

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

    # --------------------------------------------------------------------------------------------- hang or lie

    def test_a_stuck_engine_fails_within_the_deadline(self, model_dir: Path, tmp_path: Path) -> None:
        setup = self.build_setup(model_dir, tmp_path, sync_timeout=self.stuck_timeout, **self.stuck_options)
        stuck = len(setup.engines) - 1
        try:
            release = self.hold_engine(setup, stuck)
        except BaseException:
            self.close(setup)
            raise
        try:
            began = time.perf_counter()
            with pytest.raises(SyncTimeout) as raised:
                testing.run(self.train_then_sync(setup, 1))
            waited = time.perf_counter() - began
        finally:
            release()
            self.close(setup)
        message = str(raised.value)
        assert f"weight sync '{self.provider}'" in message and f"engine {stuck} (" in message, message
        assert f"rank {stuck + 1})" in message and f"within {self.stuck_timeout:g} s" in message, message
        assert waited < self.stuck_timeout * 6 + 30, f"the sync gave up after {waited:.1f} s, not near its deadline"

    def test_an_engine_that_loads_other_values_is_caught_by_read_back(self, model_dir: Path, tmp_path: Path) -> None:
        # checksums off: an engine that reports loaded checksums would be caught by them first
        setup = self.build_setup(model_dir, tmp_path, verify_sync_every=1, verify_sync_tensors=0, sync_checksums="off")
        self.assert_caught(setup, self.misloading_engine(setup, 0), rf"weight sync '{self.provider}': tensor '[^']+' "
                           r"read back from engine 0 \(.*differs from the trainer's")

    def test_an_engine_that_loads_other_values_is_caught_by_its_loaded_checksums(self, model_dir: Path,
                                                                                 tmp_path: Path) -> None:
        setup = self.build_setup(model_dir, tmp_path, verify_sync_every=0)
        self._require_loaded_checksums(setup)
        self.assert_caught(setup, self.misloading_engine(setup, 0), rf"weight sync '{self.provider}': tensor '[^']+' "
                           r"loaded by engine 0 \(.* has CRC32 [0-9a-f]{8} \(first \w+ rows as float32\), the "
                           r"trainer's is [0-9a-f]{8}")

    def test_loaded_checksums_pass_after_an_honest_sync(self, model_dir: Path, tmp_path: Path) -> None:
        setup = self.build_setup(model_dir, tmp_path, verify_sync_every=0)
        self._require_loaded_checksums(setup)
        try:
            report = testing.run(self.train_then_sync(setup, 1))
        finally:
            self.close(setup)
        assert report.metrics["sync/loaded_checksums"] == LOADED_TENSORS_PER_BUCKET * report.buckets * self.engine_count

    def _require_loaded_checksums(self, setup: SyncSetup) -> None:
        """Skip (closing ``setup``) unless every engine reports loaded checksums (engines that load
        through a server of their own: their transport's checksums cannot see inside it)."""
        if any(is_remote(engine) or not reports_loaded(engine) for engine in setup.engines):
            self.close(setup)
            pytest.skip("the engines do not report loaded checksums (loaded_checksums): the transport's own "
                        "checksums cover what they load")

    def test_read_back_passes_after_an_honest_sync(self, model_dir: Path, tmp_path: Path) -> None:
        setup = self.build_setup(model_dir, tmp_path, verify_sync_every=1, verify_sync_tensors=3)
        try:
            report = testing.run(self.train_then_sync(setup, 1))
        finally:
            self.close(setup)
        assert report.metrics["sync/verified_tensors"] == 3 * self.engine_count

    def test_the_probe_catches_an_engine_that_loaded_other_weights(self, model_dir: Path, tmp_path: Path) -> None:
        setup = self.build_setup(model_dir, tmp_path, verify_sync_every=1, verify_sync_check="probe")
        honest = setup.engines[0]
        if is_remote(honest) or is_remote(setup.trainer):
            self.close(setup)
            pytest.skip("the engine or trainer is a proxy of another process: the perturbation is injected in this one")
        self.assert_caught(setup, PerturbedEngine(honest, setup.trainer), rf"weight sync '{self.provider}': the "
                           r"probe's log-probs from engine 0 \(.* beyond --verify-sync-bound ")

    def assert_caught(self, setup: Any, dishonest: Any, match: str) -> None:
        """One training step and sync with engine 0 replaced by ``dishonest``: the sync must raise a
        :class:`SyncMismatch` matching ``match``; engine 0 is put back and the setup closed."""
        honest = setup.engines[0]
        setup.engines[0] = dishonest
        try:
            with pytest.raises(SyncMismatch, match=match):
                testing.run(self.train_then_sync(setup, 1))
        finally:
            setup.engines[0] = honest
            self.close(setup)

    def test_the_probe_passes_after_an_honest_sync(self, model_dir: Path, tmp_path: Path) -> None:
        setup = self.build_setup(model_dir, tmp_path, verify_sync_every=1, verify_sync_check="probe")
        try:
            report = testing.run(self.train_then_sync(setup, 1))
        finally:
            self.close(setup)
        assert report.metrics["sync/probed_engines"] == self.engine_count
        assert report.metrics["sync/probe_max_diff"] <= SyncGuard(setup.config, self.provider).bound
        assert "sync/verified_tensors" not in report.metrics

    def test_a_bucket_corrupted_in_transit_is_refused(self, setup: SyncSetup) -> None:
        async def scenario() -> Any:
            await setup.trainer.train_step(make_rollout_batch(self.vocab_size(setup)))
            return await self.sync_with_corrupted_bucket(setup, 1)

        with pytest.raises(SyncMismatch, match=rf"weight sync '{self.provider}': tensor '[^']+' received by engine "):
            testing.run(scenario())


async def _forever() -> None:
    await asyncio.Event().wait()


class StuckEngine:
    """An engine of this process that stops loading: ``update_weights``, ``share_weights`` and
    ``load_weights_from_disk`` never return; everything else is the wrapped engine's."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def update_weights(self, named_tensors: Any, weight_version: int) -> None:
        await _forever()

    async def share_weights(self, named_tensors: Any, weight_version: int) -> int:
        await _forever()
        return 0

    async def load_weights_from_disk(self, directory: str, weight_version: int) -> None:
        await _forever()


class PerturbedEngine:
    """An engine of this process whose served weights differ from what it was sent: before it scores
    anything after a sync (the first ``response_logprobs`` of a new ``weight_version``), one tensor
    (the trainer's first exported, plus seeded noise of standard deviation 0.05) is loaded into it,
    whatever path the sync loaded the rest by. It does not share the trainer's tensors (a sync must
    copy into it), so the change is the engine's alone."""

    def __init__(self, engine: Any, trainer: Any) -> None:
        self._engine, self._trainer = engine, trainer
        self._perturbed: int | None = None

    def __getattr__(self, name: str) -> Any:
        if name in ("share_weights", "load_weights_from_disk"):
            raise AttributeError(name)
        return getattr(self._engine, name)

    async def response_logprobs(self, token_ids: list[int], prompt_length: int, temperature: float) -> list[float]:
        version = self._engine.weight_version
        if self._perturbed != version:
            self._perturbed = version
            await self._perturb(version)
        return list(await self._engine.response_logprobs(token_ids, prompt_length, temperature))

    async def _perturb(self, version: int) -> None:
        import torch

        from plasmid_torch.tensors import as_torch

        name, tensor = next(iter(self._trainer.export_weights(1 << 30)))[0]
        value = as_torch(tensor).detach().clone()
        noise = torch.randn(value.shape, generator=torch.Generator().manual_seed(0)).to(value.dtype)
        await self._engine.update_weights([(name, value + 0.05 * noise.to(value.device))], version)


class MisloadingEngine:
    """An engine of this process that loads every tensor it is sent with one value changed (1 added
    to its first element), as an engine that mixed up or ignored what it was sent would; it does
    not share the trainer's tensors (a sync must copy into it)."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        if name in ("share_weights", "load_weights_from_disk"):
            raise AttributeError(name)
        return getattr(self._engine, name)

    async def update_weights(self, named_tensors: Any, weight_version: int) -> None:
        from plasmid_torch.tensors import as_torch

        changed = []
        for name, tensor in named_tensors:
            value = as_torch(tensor).clone()
            value.view(-1)[0] += 1
            changed.append((name, value))
        await self._engine.update_weights(changed, weight_version)
