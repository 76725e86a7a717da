"""The contract every data source (:class:`plasmid.protocols.DataSource`) must keep.

Subclass it in the plugin's tests, naming the plugin module and the provider::

    from plasmid.testing import DataSourceContract

    class TestMySource(DataSourceContract):
        plugin = my_package.plugin
        provider = "my-source"
        config_options = {"prompt_data": "examples/prompts.jsonl"}

The source is built the way the kernel builds it: ``make_config`` with ``--datasource`` set to
the provider (so the plugin's ``plasmid_configure`` sees it chosen), then ``factory(config)``.
Options come from the ``config_options`` class attribute and the ``datasource_options`` fixture
(override it for options that need other fixtures: a model directory, a data file written in
the test).

What is checked: ``get_groups(n)`` gives ``n`` groups of ``--n-samples-per-prompt`` independent
copies of one prompt with non-empty integer ``tokens``; sample and group indexes keep counting
up; ``state_dict`` is JSON and resuming from it yields exactly the groups an uninterrupted source
yields, across epoch boundaries and with groups given back; given-back groups come out first;
the eval split is non-empty, one sample per group and the same in every build.

Multimodal (opt-in): a source that yields prompts with images claims it by setting
``image_metadata_key`` to the ``Sample.metadata`` key of its samples' JSON image reference
(``plasmid_torch.vision.VISION_KEY`` for the torch library's engines and trainers). Then some of the
first ``image_groups`` groups must carry a non-empty reference, the prompt and the reference must be
JSON, and groups with images given back must come out of a checkpoint (``state_dict`` through JSON)
and out of the rollout's own JSON form (:func:`plasmid.groups.group_to_state`) unchanged; override
the ``rebuild_images`` fixture to also compare what the images become for a model (pixel values).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest

from plasmid.config import Config
from plasmid.groups import group_from_state, group_to_state
from plasmid.protocols import DataSource
from plasmid.testing import build, make_config
from plasmid.types import Group, Sample, Status

#: The ``make_source`` fixture: every call builds a fresh data source.
MakeSource = Callable[[], DataSource]


def sample_fingerprint(sample: Sample) -> tuple[Any, ...]:
    """What must be equal for two samples to be "the same prompt at the same place"."""
    return (sample.prompt, sample.label, list(sample.tokens), sample.metadata, sample.index,
            sample.group_index, sample.response, sample.response_length)


def groups_fingerprint(groups: list[Group]) -> list[tuple[int, list[tuple[Any, ...]]]]:
    return [(group.index, [sample_fingerprint(s) for s in group.samples]) for group in groups]


class DataSourceContract:
    """Pytest class checking one data source against :class:`plasmid.protocols.DataSource`.

    :cvar plugin: the plugin module (the one with the hookimpls).
    :cvar provider: the name the plugin registers the data source under.
    :cvar config_options: extra options for :func:`plasmid.testing.make_config` (Python names).
    :cvar n_samples_per_prompt: copies per group the tests ask for (not the kernel default 8,
        so a source that ignores the option fails).
    :cvar draws_across_epochs: sizes of consecutive ``get_groups`` calls in the resume test;
        their sum should exceed the training split so that the test crosses an epoch boundary
        (the default suits splits of up to 150 prompts; set it for larger ones).
    """

    plugin: ClassVar[Any] = None
    provider: ClassVar[str] = ""
    config_options: ClassVar[dict[str, Any]] = {}
    n_samples_per_prompt: ClassVar[int] = 3
    draws_across_epochs: ClassVar[tuple[int, ...]] = (7, 50, 50, 50)
    #: the ``Sample.metadata`` key of the samples' JSON image reference; set it to claim images (module docs)
    image_metadata_key: ClassVar[str | None] = None
    #: groups the multimodal checks draw; some of them must have images
    image_groups: ClassVar[int] = 4

    # ------------------------------------------------------------------------------- fixtures
    @pytest.fixture
    def datasource_options(self) -> dict[str, Any]:
        """Options added to :attr:`config_options`; override this fixture when they come from
        other fixtures (a model directory or a data file built under ``tmp_path``)."""
        return {}

    @pytest.fixture
    def config(self, tmp_path: Path, datasource_options: dict[str, Any]) -> Config:
        """The run's configuration, as the kernel makes it once ``--datasource`` is resolved."""
        options = {"datasource": self.provider, "n_samples_per_prompt": self.n_samples_per_prompt,
                   **self.config_options, **datasource_options}
        return make_config(self.plugin, run_dir=tmp_path / "run", **options)

    @pytest.fixture
    def make_source(self, config: Config) -> MakeSource:
        """``make_source()``: a freshly built source for ``config`` (every call a new one)."""

        def factory() -> DataSource:
            source: DataSource = build("datasource", self.provider, self.plugin, config=config)
            return source

        return factory

    @pytest.fixture
    def source(self, make_source: MakeSource) -> DataSource:
        return make_source()

    @pytest.fixture
    def rebuild_images(self) -> Callable[[Sample], Any] | None:
        """``None``, or a function of a sample with images giving what they become for a model (compared
        with ``==``: pixel values as bytes, say); override it to check that restored samples rebuild
        the same images."""
        return None

    def drawn_with_images(self, source: DataSource) -> list[Group]:
        """:attr:`image_groups` groups of ``source`` (skips the test unless :attr:`image_metadata_key` is
        set); fails unless some carry images."""
        if self.image_metadata_key is None:
            pytest.skip("set image_metadata_key to claim prompts with images")
        groups = source.get_groups(self.image_groups)
        assert any(self.image_metadata_key in group.samples[0].metadata for group in groups), \
            f"none of {self.image_groups} groups has metadata[{self.image_metadata_key!r}]"
        return groups

    # ------------------------------------------------------------------------------- shape
    def test_source_satisfies_the_protocol(self, source: DataSource) -> None:
        assert isinstance(source, DataSource)

    def test_get_groups_returns_n_groups_of_n_samples_per_prompt(self, source: DataSource, config: Config) -> None:
        groups = source.get_groups(5)
        assert len(groups) == 5
        for group in groups:
            assert isinstance(group, Group)
            assert len(group.samples) == config.option.n_samples_per_prompt
            assert all(isinstance(sample, Sample) for sample in group.samples)

    def test_asking_for_no_groups_returns_none_and_consumes_nothing(self, make_source: MakeSource) -> None:
        original, untouched = make_source(), make_source()
        assert original.get_groups(0) == []
        assert groups_fingerprint(original.get_groups(3)) == groups_fingerprint(untouched.get_groups(3))

    def test_samples_of_a_group_are_fresh_copies_of_one_tokenized_prompt(self, source: DataSource) -> None:
        for group in source.get_groups(4):
            first = group.samples[0]
            assert first.tokens, f"group {group.index}: the prompt has no tokens"
            assert all(isinstance(token, int) for token in first.tokens)
            for sample in group.samples:
                assert (sample.prompt, sample.label, sample.tokens) == (first.prompt, first.label, first.tokens)
                assert sample.metadata == first.metadata
                assert (sample.response, sample.response_length, sample.status) == ("", 0, Status.PENDING)

    def test_samples_of_a_group_share_no_mutable_state(self, source: DataSource) -> None:
        first, second = source.get_groups(1)[0].samples[:2]
        assert first is not second
        prompt_tokens = list(second.tokens)
        first.tokens.append(-1)
        first.metadata["written by"] = "the rollout"
        assert second.tokens == prompt_tokens
        assert "written by" not in second.metadata

    def test_indexes_count_up_across_calls(self, source: DataSource) -> None:
        groups = source.get_groups(3) + source.get_groups(4)
        sample_indexes = [sample.index for group in groups for sample in group.samples]
        assert sample_indexes == sorted(set(sample_indexes)), "sample indexes must be unique and increasing"
        group_indexes = [group.index for group in groups]
        assert group_indexes == sorted(set(group_indexes)), "group indexes must be unique and increasing"
        for group in groups:
            assert {sample.group_index for sample in group.samples} == {group.index}

    # ------------------------------------------------------------------------------- resume
    def test_state_dict_is_json(self, source: DataSource) -> None:
        source.get_groups(2)
        state = source.state_dict()
        assert json.loads(json.dumps(state)) == state

    def test_resume_yields_the_same_next_groups_at_every_point(self, source: DataSource,
                                                              make_source: MakeSource) -> None:
        """Resumed from a (JSON round-tripped) state at each point, a fresh source continues
        exactly like the uninterrupted one, including across epoch boundaries."""
        for size in self.draws_across_epochs:
            state = json.loads(json.dumps(source.state_dict()))
            resumed = make_source()
            resumed.load_state_dict(state)
            expected = source.get_groups(size)
            assert groups_fingerprint(resumed.get_groups(size)) == groups_fingerprint(expected)

    def test_groups_given_back_come_out_first(self, source: DataSource) -> None:
        drawn = source.get_groups(4)
        source.add_groups(drawn[1:3])
        again = source.get_groups(3)
        assert groups_fingerprint(again[:2]) == groups_fingerprint(drawn[1:3])
        assert again[2].index > drawn[3].index, "after the given-back groups come new ones"

    def test_groups_given_back_survive_a_resume(self, source: DataSource, make_source: MakeSource) -> None:
        given_back = source.get_groups(2)
        for sample in given_back[0].samples:  # a partial rollout: part of a response exists
            sample.metadata["partial"] = True
        source.add_groups(given_back)
        resumed = make_source()
        resumed.load_state_dict(json.loads(json.dumps(source.state_dict())))
        assert groups_fingerprint(resumed.get_groups(4)) == groups_fingerprint(source.get_groups(4))

    # ------------------------------------------------------------------------------- images
    def test_samples_with_images_carry_a_json_reference_and_a_json_prompt(self, source: DataSource) -> None:
        for group in self.drawn_with_images(source):
            for sample in group.samples:
                reference = sample.metadata.get(str(self.image_metadata_key))
                if reference is None:
                    continue
                assert reference, f"sample {sample.index}: an empty image reference"
                assert json.loads(json.dumps(reference)) == reference, "the image reference is not JSON"
                assert json.loads(json.dumps(sample.prompt)) == sample.prompt, "a prompt with images is not JSON"

    def test_groups_with_images_round_trip_a_checkpoint_and_json(
            self, source: DataSource, make_source: MakeSource, rebuild_images: Callable[[Sample], Any] | None) -> None:
        """Given back, checkpointed (``state_dict`` through JSON) and resumed, and through the rollout's
        JSON form, groups with images come back with the same prompt, tokens and reference."""
        drawn = self.drawn_with_images(source)
        with_images = [group for group in drawn if self.image_metadata_key in group.samples[0].metadata]
        through_json = [group_from_state(json.loads(json.dumps(group_to_state(group)))) for group in with_images]
        assert groups_fingerprint(through_json) == groups_fingerprint(with_images)
        source.add_groups(with_images)
        resumed = make_source()
        resumed.load_state_dict(json.loads(json.dumps(source.state_dict())))
        restored = resumed.get_groups(len(with_images))
        assert groups_fingerprint(restored) == groups_fingerprint(with_images)
        if rebuild_images is not None:
            for before, after in zip(with_images, restored, strict=True):
                assert rebuild_images(after.samples[0]) == rebuild_images(before.samples[0]), \
                    f"group {before.index}: the restored reference rebuilds other images"

    # ------------------------------------------------------------------------------- eval
    def test_eval_split_is_nonempty_one_sample_per_group_and_fixed(self, make_source: MakeSource) -> None:
        first, second = make_source().eval_groups(), make_source().eval_groups()
        assert first, "the eval split is empty"
        assert all(len(group.samples) == 1 and group.samples[0].tokens for group in first)
        assert groups_fingerprint(first) == groups_fingerprint(second)

    def test_eval_does_not_move_the_training_stream(self, make_source: MakeSource) -> None:
        evaluated, untouched = make_source(), make_source()
        evaluated.eval_groups()
        assert groups_fingerprint(evaluated.get_groups(3)) == groups_fingerprint(untouched.get_groups(3))
