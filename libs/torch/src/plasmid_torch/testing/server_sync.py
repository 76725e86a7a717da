"""Scaffolding for the weight-sync tests of engines that serve the model from a server process
(plasmid-vllm, plasmid-sglang): the kernel's :class:`WeightSyncContract` with a torchtrain
trainer on a GRPO loss, one torch thread, engines shared by the test session, and one exact
check on top of the contract::

    class VLLMSyncContract(ServerSyncContract):
        plugin = plasmid_vllm.plugin
        loss_plugin, trainer_plugin = plasmid_grpo_plugin, plasmid_torchtrain_plugin
        extra_plugins = (plasmid_grpo_plugin, plasmid_torchtrain_plugin, plasmid_sync.plugin)

        def make_engines(self, config, count): ...   # the session's engines
        def close(self, setup): ...                   # put the checkpoint back

Its deadline test freezes the engine's server processes (:meth:`ServerSyncContract.hold_engine`), so
the engine is really stuck, whatever path its transport loads by.

The exact check: after syncing a trainer whose tied input embedding is zero, every hidden state
is zero, so every logit is equal and every log-prob an engine scores (at temperature 1 and 0.7)
is ``-ln(vocabulary size)``, ``-ln(16)`` for the tiny test models.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from plasmid import testing
from plasmid.config import Config
from plasmid.protocols import Trainer
from plasmid_torch.testing.contracts.weightsync import SyncSetup, WeightSyncContract


class ServerSyncContract(WeightSyncContract):
    """:class:`WeightSyncContract` for server-backed engines; subclasses set ``plugin``,
    ``provider``, ``extra_plugins``, ``loss_plugin`` and ``trainer_plugin`` (the plugin modules of
    ``grpo`` and ``torchtrain``) and implement :meth:`make_engines`."""

    loss_plugin: Any = None
    trainer_plugin: Any = None
    #: vocabulary size of the test model (the uniform log-prob is ``-ln`` of it)
    vocab: int = 16

    @pytest.fixture(autouse=True)
    def _one_thread(self) -> Iterator[None]:
        torch.set_num_threads(1)
        yield

    def make_trainer(self, config: Config) -> Trainer:
        """A ``torchtrain`` trainer with the ``grpo`` loss on ``--model``."""
        loss = testing.build("loss", "grpo", self.loss_plugin, config=config)
        trainer: Trainer = testing.build("trainer", "torchtrain", self.trainer_plugin, config=config, args=(loss,))
        return trainer

    def hold_engine(self, setup: SyncSetup, index: int) -> Callable[[], None]:
        """A really stuck engine for the contract's deadline test: every process of engine ``index``'s
        launched servers is frozen (``SIGSTOP``, :meth:`plasmid_serving.server_process.ManagedServer.freeze`)
        until the returned function continues them; the engine stays the real one, so whatever call the
        transport makes to load (its own HTTP endpoint included) hangs. The servers' health checks wait
        up to 30 s, longer than the test, so the monitor does not restart them."""
        engine = setup.engines[index]
        thaws = [server.process.freeze() for server in getattr(engine, "servers", []) if server.process is not None]
        if not thaws:
            pytest.skip(f"engine {index} has no launched server to freeze")

        def release() -> None:
            for thaw in thaws:
                thaw()

        return release

    def test_a_trainer_with_a_zero_embedding_makes_every_logprob_uniform(self, setup: SyncSetup) -> None:
        with torch.no_grad():
            setup.trainer.model.get_input_embeddings().weight.zero_()  # type: ignore[attr-defined]

        async def scenario() -> tuple[Any, list[list[float]]]:
            report = await setup.sync.sync(setup.trainer, setup.engines, 6)
            scored = [await engine.response_logprobs([1, 4, 5, 6, 7, 8], 2, temperature) for engine in setup.engines
                      for temperature in (1.0, 0.7)]
            return report, scored

        report, scored = testing.run(scenario())
        assert report.weight_version == 6 and all(engine.weight_version == 6 for engine in setup.engines)
        for values in scored:
            assert len(values) == 4 and max(abs(v + math.log(self.vocab)) for v in values) < 1e-6
