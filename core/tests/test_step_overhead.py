"""Per-step work of the kernel kept small without changing results: the samples of a group are
copied cheaply but still share nothing mutable (:func:`plasmid.groups.independent_copy`), and the
reward curve is not drawn in the first ``plot_seconds`` of a run (:class:`plasmid.app.runlog.RunLog`)."""

from __future__ import annotations

import copy
import io

import pytest

from plasmid.app.runlog import RunLog
from plasmid.groups import independent_copy, make_group

VALUES = ["12+34=", 7, 2.5, None, True, b"x", {"task": "mod10", "n": 3}, [1, 2, 3],
          [{"role": "user", "content": "hi"}], {"nested": {"a": [1]}}, (1, [2]), {1: "a"}, []]


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_an_independent_copy_equals_a_deep_copy_and_shares_nothing_mutable(value):
    made = independent_copy(value)
    assert made == copy.deepcopy(value) and type(made) is type(value)
    if isinstance(value, (dict, list, tuple)) and value:
        first = value[0] if isinstance(value, (list, tuple)) else next(iter(value.values()))
        if isinstance(value, (dict, list)):
            assert made is not value
        if isinstance(first, (dict, list)) or isinstance(value, tuple):
            assert all(a is not b for a, b in zip(_mutables(made), _mutables(value), strict=True))


def _mutables(value):
    items = value.values() if isinstance(value, dict) else value
    return [item for item in items if isinstance(item, (dict, list))]


def test_samples_of_a_group_share_no_metadata_prompt_or_label():
    group = make_group([{"role": "user", "content": "q"}], [1, 2], {"answer": "4"}, {"task": "t"}, copies=3,
                       first_sample_index=6, group_index=2)
    first, second = group.samples[0], group.samples[1]
    first.metadata["seen"] = 1
    first.prompt[0]["content"] = "changed"
    first.label["answer"] = "5"
    first.tokens.append(9)
    assert second.metadata == {"task": "t"} and second.prompt[0]["content"] == "q" and second.label == {"answer": "4"}
    assert second.tokens == [1, 2]
    assert [s.index for s in group.samples] == [6, 7, 8] and {s.group_index for s in group.samples} == {2}


def test_the_curve_is_not_drawn_before_plot_seconds_have_passed_but_at_the_end(tmp_path):
    log = RunLog(tmp_path, 30, stream=io.StringIO(), plot_every=10, plot_seconds=3600)
    drawn = []
    log.plot = lambda: drawn.append(len(log.history))
    for step in range(29):
        log.write(step, {"rollout/reward_mean": 0.5})
    assert drawn == [], "a short run paid for drawing the curve mid-run"
    log.write(29, {"rollout/reward_mean": 0.5})
    assert drawn == [30]

    log = RunLog(tmp_path / "other", 30, stream=io.StringIO(), plot_every=10, plot_seconds=0)
    log.plot = lambda: drawn.append(len(log.history))
    (tmp_path / "other").mkdir()
    for step in range(12):
        log.write(step, {"rollout/reward_mean": 0.5})
    assert drawn[1:] == [11]     # step 10, once plot_seconds (0 here) have passed
