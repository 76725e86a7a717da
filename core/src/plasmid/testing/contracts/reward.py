"""The contract every reward provider keeps; a reward plugin's tests subclass :class:`RewardContract`.

::

    from plasmid.testing import RewardContract
    import my_package.plugin

    class TestMyReward(RewardContract):
        plugin = my_package.plugin          # the module with the hookimpls
        provider = "my-reward"              # the name it registers
        config_options = {"my_option": 3}   # options the factory needs (Python names)
        cases = [("42", "42"), ("41", "42")]  # (response, label) pairs meaningful to this reward

The suite builds the provider the way the kernel does (``factory(config)`` from
``plasmid.testing.make_config(plugin, **config_options)``) and checks what the rollout side relies
on: the call is awaitable; it returns a finite float or a dict of finite floats (a group reward,
``group = True``, returns one such value per sample, in order); it leaves the sample's prompt,
tokens, response and label alone; concurrent calls give what sequential calls give; an empty
response scores a finite value; and :class:`plasmid.rewards.RewardSet` can combine it.

Override ``cases`` (or the ``samples`` fixture, for samples that need more than a response and a
label) with inputs that exercise the reward. Set ``deterministic = False`` for a reward that may
score one input differently twice (a sampled judge); the concurrency check then compares only
shapes. Set ``reward_key`` when the reward returns a dict with more than one key.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import math
import numbers
from pathlib import Path
from typing import Any, ClassVar

import pytest

from plasmid.config import Config
from plasmid.rewards import RewardComponent, RewardSet
from plasmid.testing import build, make_config, make_registry, run
from plasmid.types import RewardParts, Sample, Status


def make_sample(response: str, label: Any, *, prompt: str = "1+2=", index: int = 0, group_index: int = 0) -> Sample:
    """A finished sample with ``response`` and ``label``, as a generate function leaves it.

    Token ids are stand-ins (one per character, offset past the special tokens); rewards see the
    text in ``response`` and may read ``tokens``/``response_length`` but must not change them.
    """
    prompt_ids = [1] + [3 + ord(char) % 200 for char in prompt]
    response_ids = [3 + ord(char) % 200 for char in response]
    return Sample(
        prompt=prompt,
        tokens=prompt_ids + response_ids,
        response=response,
        response_length=len(response_ids),
        loss_mask=[1] * len(response_ids),
        rollout_logprobs=[-0.5] * len(response_ids),
        label=label,
        status=Status.COMPLETED,
        weight_version=0,
        index=index,
        group_index=group_index,
    )


def check_reward_value(value: Any, where: str) -> None:
    """Fail unless ``value`` is a finite real number, a non-empty dict of named finite ones, or a
    :class:`plasmid.types.RewardParts` whose value is finite and whose parts are named finite numbers."""
    if isinstance(value, RewardParts):
        check_reward_value(value.value, f"{where}.value")
        for key, item in value.parts.items():
            assert isinstance(key, str), f"{where} returned a part with a non-string name {key!r}"
            check_reward_value(item, f"{where}.parts[{key!r}]")
        return
    if isinstance(value, dict):
        assert value, f"{where} returned an empty dict; return a float, or a dict of named floats"
        for key, item in value.items():
            assert isinstance(key, str), f"{where} returned a dict with a non-string key {key!r}"
            check_reward_value(item, f"{where}[{key!r}]")
        return
    assert not isinstance(value, bool), f"{where} returned the bool {value!r}; return float({value!r})"
    assert isinstance(value, numbers.Real), (
        f"{where} returned {type(value).__name__} {value!r}; a reward returns a float or a dict of floats"
    )
    assert math.isfinite(float(value)), f"{where} returned the non-finite reward {value!r}"


def _snapshot(sample: Sample) -> tuple[Any, ...]:
    """What a reward must leave unchanged, deep-copied."""
    return copy.deepcopy((sample.prompt, sample.tokens, sample.response, sample.response_length, sample.label))


class RewardContract:
    """Subclass with ``plugin`` and ``provider``; see the module docstring."""

    #: The module (or object) with the plugin's hookimpls.
    plugin: ClassVar[Any] = None
    #: The name the plugin registers in ``plasmid_rewards``.
    provider: ClassVar[str] = ""
    #: Options for ``make_config`` (Python names), e.g. ``{"judge_url": "http://..."}``.
    config_options: ClassVar[dict[str, Any]] = {}
    #: ``(response, label)`` pairs the samples are made from; replace with meaningful ones.
    cases: ClassVar[list[tuple[str, Any]]] = [("3", "3"), ("4", "3"), (" 3\n", "3"), ("the answer is 3", "3")]
    #: Whether one input always gets one score (False for sampled judges).
    deterministic: ClassVar[bool] = True
    #: The ``--reward-key`` to use when the reward returns a dict with several keys.
    reward_key: ClassVar[str | None] = None
    #: How many copies of ``samples`` the concurrency check scores at once.
    concurrency: ClassVar[int] = 8

    # ------------------------------------------------------------------------------ fixtures
    @pytest.fixture
    def config(self, tmp_path: Path) -> Config:
        """The configuration the provider is built from."""
        return make_config(self.plugin, run_dir=tmp_path / "run", **self.config_options)

    @pytest.fixture
    def reward_fn(self, config: Config) -> Any:
        """The provider, built by its registered factory."""
        return build("reward", self.provider, self.plugin, config=config)

    @pytest.fixture
    def samples(self) -> list[Sample]:
        """One group of finished samples, made from ``cases``."""
        return [make_sample(response, label, index=i) for i, (response, label) in enumerate(self.cases)]

    # ------------------------------------------------------------------------------ helpers
    def is_group(self, reward_fn: Any) -> bool:
        return bool(getattr(reward_fn, "group", False))

    async def score(self, reward_fn: Any, samples: list[Sample]) -> list[Any]:
        """One value per sample: one call per sample, or one call for the group."""
        if self.is_group(reward_fn):
            values = list(await self.call(reward_fn, samples))
            assert len(values) == len(samples), (
                f"{self.where()} returned {len(values)} values for {len(samples)} samples"
            )
            return values
        return [await self.call(reward_fn, sample) for sample in samples]

    def call(self, reward_fn: Any, argument: Any) -> Any:
        """``reward_fn(argument)``, which must be awaitable."""
        pending = reward_fn(argument)
        signature = "samples" if self.is_group(reward_fn) else "sample"
        assert inspect.isawaitable(pending), (
            f"{self.where()} returned {type(pending).__name__} without awaiting; "
            f"it must be `async def __call__(self, {signature})`"
        )
        return pending

    def where(self) -> str:
        return f"reward '{self.provider}'"

    # ------------------------------------------------------------------------------ the contract
    def test_provider_is_registered_under_plasmid_rewards(self) -> None:
        assert self.plugin is not None and self.provider, "set the class attributes `plugin` and `provider`"
        registry = make_registry(self.plugin)
        assert self.provider in registry.names("reward"), (
            f"{self.where()} is not registered by plasmid_rewards of {self.plugin!r}; "
            f"registered rewards: {registry.names('reward')}"
        )

    def test_factory_builds_a_callable_from_config(self, reward_fn: Any) -> None:
        assert callable(reward_fn), f"the factory of {self.where()} returned {reward_fn!r}, which is not callable"
        group = getattr(reward_fn, "group", False)
        assert isinstance(group, bool), f"{self.where()} has `group = {group!r}`; it must be True or False"

    def test_call_is_awaitable_and_returns_finite_values(self, reward_fn: Any, samples: list[Sample]) -> None:
        where = self.where()
        if self.is_group(reward_fn):
            values = run(self.call(reward_fn, samples))
            assert isinstance(values, (list, tuple)), f"{where} returned {type(values).__name__}; expected a list"
            assert len(values) == len(samples), f"{where} returned {len(values)} values for {len(samples)} samples"
        else:
            values = [run(self.call(reward_fn, sample)) for sample in samples]
        for sample, value in zip(samples, values, strict=True):
            check_reward_value(value, f"{where} on response {sample.response!r} (label {sample.label!r})")

    def test_does_not_change_the_sample(self, reward_fn: Any, samples: list[Sample]) -> None:
        before = [_snapshot(sample) for sample in samples]
        run(self.score(reward_fn, samples))
        for sample, snapshot in zip(samples, before, strict=True):
            assert _snapshot(sample) == snapshot, (
                f"{self.where()} changed the prompt, tokens, response or label of sample {sample.index}; "
                f"rewards read samples, they do not edit them"
            )

    def test_concurrent_calls_give_what_sequential_calls_give(self, reward_fn: Any, samples: list[Sample]) -> None:
        batches = [copy.deepcopy(samples) for _ in range(self.concurrency)]

        async def sequential_then_concurrent() -> tuple[list[list[Any]], list[list[Any]]]:
            one_by_one = [await self.score(reward_fn, batch) for batch in batches]
            together = await asyncio.gather(*(self.score(reward_fn, batch) for batch in batches))
            return one_by_one, list(together)

        one_by_one, together = run(sequential_then_concurrent())
        for batch in together:
            assert len(batch) == len(samples)
            for value in batch:
                check_reward_value(value, f"{self.where()} under concurrent calls")
        if self.deterministic:
            assert together == one_by_one, (
                f"{self.where()} scored the same samples differently when called concurrently; "
                f"it must not share mutable state between calls (or set deterministic = False)"
            )

    def test_empty_response_scores_a_finite_value(self, reward_fn: Any, samples: list[Sample]) -> None:
        empty = [make_sample("", sample.label, prompt=str(sample.prompt), index=sample.index) for sample in samples]
        values = run(self.score(reward_fn, empty))
        for value in values:
            check_reward_value(value, f"{self.where()} on an empty response")

    def test_reward_set_combines_it_without_failures(self, reward_fn: Any, samples: list[Sample]) -> None:
        rewards = RewardSet([RewardComponent(self.provider, 0.5, reward_fn, plugin="(test)")],
                            reward_key=self.reward_key, errors="fail")
        run(rewards.score_group(samples))
        for sample in samples:
            assert sample.reward is not None and math.isfinite(sample.reward)
            assert sample.reward == pytest.approx(0.5 * sample.reward_components[self.provider])
        assert rewards.pop_metrics() == {}
