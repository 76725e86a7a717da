"""The contract every group filter keeps; a filter plugin's tests subclass :class:`FilterContract`.

::

    from plasmid.testing import FilterContract
    import my_package.plugin

    class TestMyFilter(FilterContract):
        plugin = my_package.plugin        # the module with the hookimpls
        provider = "my-filter"            # the name it registers
        config_options = {"max_len": 4}   # options the factory needs (Python names)

The suite builds the filter the way the kernel does (``factory(config)`` from
``plasmid.testing.make_config(plugin, **config_options)``) and calls it on scored groups, as a
rollout driver does after the rewards ran. It checks that the call returns a
:class:`~plasmid.types.Verdict`, that one group always gets one verdict (from the same filter
and from a freshly built one), that the group is left exactly as it was, and that a dropped
group comes with a non-empty ``reason`` (the rollout driver counts drops by reason).

Override ``groups_rewards`` (the rewards of each group's samples) or the ``groups`` fixture (for
groups that need other fields set) with groups that exercise the filter.
"""

from __future__ import annotations

import copy
import inspect
from pathlib import Path
from typing import Any, ClassVar

import pytest

from plasmid.config import Config
from plasmid.testing import build, make_config, make_registry
from plasmid.types import Group, Sample, Status, Verdict


def make_group(rewards: list[float], *, index: int = 0, responses: list[str] | None = None) -> Group:
    """A scored group: one finished sample per reward (response ``responses[i]``, default a
    digit), with stand-in token ids and ``reward_components`` of a single reward ``"test"``."""
    samples = []
    for position, reward in enumerate(rewards):
        response = responses[position] if responses is not None else str(position % 10)
        response_ids = [3 + ord(char) % 200 for char in response]
        samples.append(Sample(
            prompt="1+2=",
            tokens=[1, 4, 5, 6, 7] + response_ids,
            response=response,
            response_length=len(response_ids),
            loss_mask=[1] * len(response_ids),
            rollout_logprobs=[-0.5] * len(response_ids),
            reward=float(reward),
            reward_components={"test": float(reward)},
            label="3",
            status=Status.COMPLETED,
            weight_version=0,
            index=index * len(rewards) + position,
            group_index=index,
        ))
    return Group(samples=samples, index=index)


class FilterContract:
    """Subclass with ``plugin`` and ``provider``; see the module docstring."""

    #: The module (or object) with the plugin's hookimpls.
    plugin: ClassVar[Any] = None
    #: The name the plugin registers in ``plasmid_filters``.
    provider: ClassVar[str] = ""
    #: Options for ``make_config`` (Python names).
    config_options: ClassVar[dict[str, Any]] = {}
    #: The rewards of the samples of each test group; replace with groups meaningful to the filter.
    groups_rewards: ClassVar[list[list[float]]] = [
        [1.0, 0.0, 1.0, 0.0],
        [1.0, 1.0, 1.0, 1.0],
        [0.0, 0.0, 0.0, 0.0],
        [0.25, 0.5, 0.75, 1.0],
        [1.0],
    ]

    # ------------------------------------------------------------------------------ fixtures
    @pytest.fixture
    def config(self, tmp_path: Path) -> Config:
        """The configuration the filter is built from."""
        return make_config(self.plugin, run_dir=tmp_path / "run", **self.config_options)

    @pytest.fixture
    def filter_fn(self, config: Config) -> Any:
        """The filter, built by its registered factory."""
        return build("filter", self.provider, self.plugin, config=config)

    @pytest.fixture
    def groups(self) -> list[Group]:
        """Scored groups, made from ``groups_rewards``."""
        return [make_group(rewards, index=i) for i, rewards in enumerate(self.groups_rewards)]

    def where(self) -> str:
        return f"filter '{self.provider}'"

    # ------------------------------------------------------------------------------ the contract
    def test_provider_is_registered_under_plasmid_filters(self) -> None:
        assert self.plugin is not None and self.provider, "set the class attributes `plugin` and `provider`"
        registry = make_registry(self.plugin)
        assert self.provider in registry.names("filter"), (
            f"{self.where()} is not registered by plasmid_filters of {self.plugin!r}; "
            f"registered filters: {registry.names('filter')}"
        )

    def test_returns_a_verdict(self, filter_fn: Any, groups: list[Group]) -> None:
        assert callable(filter_fn), f"the factory of {self.where()} returned {filter_fn!r}, which is not callable"
        for group in groups:
            verdict = filter_fn(group)
            assert not inspect.isawaitable(verdict), f"{self.where()} must be a plain (not async) `__call__(group)`"
            assert isinstance(verdict, Verdict), (
                f"{self.where()} returned {type(verdict).__name__} {verdict!r}; return plasmid.Verdict(keep, reason)"
            )
            assert isinstance(verdict.keep, bool), (
                f"{self.where()} returned Verdict(keep={verdict.keep!r}); keep is a bool"
            )

    def test_a_dropped_group_names_its_reason(self, filter_fn: Any, groups: list[Group]) -> None:
        for group in groups:
            verdict = filter_fn(group)
            if not verdict.keep:
                assert isinstance(verdict.reason, str) and verdict.reason.strip(), (
                    f"{self.where()} dropped group {group.rewards} without a reason; "
                    f"return Verdict(False, 'why') so that drops are counted by reason"
                )

    def test_one_group_always_gets_one_verdict(self, filter_fn: Any, config: Config, groups: list[Group]) -> None:
        rebuilt = build("filter", self.provider, self.plugin, config=config)
        for group in groups:
            first = filter_fn(group)
            assert filter_fn(copy.deepcopy(group)) == first, (
                f"{self.where()} changed its verdict on group {group.rewards}"
            )
            assert rebuilt(copy.deepcopy(group)) == first, (
                f"a second {self.where()} judged group {group.rewards} differently from the first"
            )

    def test_does_not_change_the_group(self, filter_fn: Any, groups: list[Group]) -> None:
        for group in groups:
            before = repr(copy.deepcopy(group))
            filter_fn(group)
            assert repr(group) == before, f"{self.where()} changed the group it judged; filters only read groups"
