"""The typed rest of the contract: ``RolloutEngine.response_logprobs`` (formerly ``score``, which
still works through :func:`plasmid.providers.adopt_legacy_score`), the loss capabilities as
protocols, and ``register`` as :class:`plasmid.protocols.Register`."""

from __future__ import annotations

import asyncio
import inspect
import warnings

import pytest

from plasmid import hookimpl, hookspecs, providers, testing
from plasmid.protocols import (
    Register,
    RolloutEngine,
    SupportsMinSamples,
    SupportsOldLogprobsDeclaration,
    SupportsReferenceScores,
    SupportsTrainingSamples,
)
from plasmid.testing.scripted import ScriptedEngine


class LegacyEngine(ScriptedEngine):
    """A third-party engine written before the rename: it has ``score`` only (the scripted
    engine's ``response_logprobs`` is hidden until one is set on the instance)."""

    def __getattribute__(self, name):
        if name == "response_logprobs" and "response_logprobs" not in object.__getattribute__(self, "__dict__"):
            raise AttributeError(name)
        return object.__getattribute__(self, name)

    async def score(self, token_ids, prompt_length, temperature):
        return [-1.0] * (len(token_ids) - prompt_length)


class Plugin:
    @hookimpl
    def plasmid_generators(self, register):
        register("legacy", lambda config: LegacyEngine(config))
        register("scripted", lambda config: ScriptedEngine(config))


def test_an_engine_with_only_score_gets_the_new_name_with_a_deprecation_warning():
    config = testing.make_config(Plugin())
    with pytest.warns(DeprecationWarning, match=r"engine 'legacy' .*RolloutEngine.score is deprecated"):
        engine = providers.build("engine", "legacy", config, registry=testing.make_registry(Plugin()))
    assert isinstance(engine, RolloutEngine)
    assert asyncio.run(engine.response_logprobs([1, 2, 3], 1, 1.0)) == [-1.0, -1.0]
    with pytest.warns(DeprecationWarning):
        assert isinstance(testing.build("engine", "legacy", Plugin(), config=config), RolloutEngine)


def test_an_engine_with_the_new_name_is_left_alone_and_keeps_its_score_alias():
    config = testing.make_config(Plugin())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        engine = providers.build("engine", "scripted", config, registry=testing.make_registry(Plugin()))
    assert "response_logprobs" not in vars(engine)
    assert asyncio.run(engine.score([1, 2, 3], 1, 1.0)) == asyncio.run(engine.response_logprobs([1, 2, 3], 1, 1.0))


def test_loss_capabilities_are_protocols_tested_with_isinstance():
    class Plain:
        needs_ref = needs_critic = needs_old_logprobs = False

    class Declares(Plain):
        min_samples_per_prompt = 2
        advantages_read_old_logprobs = False
        reference_logprobs_key = "teacher_logprobs"

        def training_samples(self, samples, rollout_id=0):
            return list(samples)

    for capability in (SupportsMinSamples, SupportsOldLogprobsDeclaration, SupportsReferenceScores,
                       SupportsTrainingSamples):
        assert isinstance(Declares(), capability) and not isinstance(Plain(), capability), capability


def test_every_registration_hook_takes_a_register():
    hooks = [name for name, spec in vars(hookspecs).items() if name.startswith("plasmid_")
             and "register" in inspect.signature(spec).parameters]
    assert len(hooks) == 12
    for name in hooks:
        assert inspect.signature(getattr(hookspecs, name)).parameters["register"].annotation == "Register", name
    assert Register.__call__.__annotations__["default"] == "bool"
