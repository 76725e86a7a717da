"""Per-sample metrics a generate function leaves in ``metadata["rollout_metrics"]`` (multi-turn's
turns, tool calls, ...) become the step's ``rollout/<name>`` means; single-turn steps are unchanged."""

from __future__ import annotations

import plasmid_rollout.plugin
import pytest
from plasmid_rollout.driver import reset_to_prompt, sample_metrics

from plasmid.testing import build, make_config
from plasmid.testing.contracts.filter import make_group

MULTITURN = ("rollout/turns_mean", "rollout/tool_calls_mean", "rollout/tool_errors_mean",
             "rollout/tool_seconds_mean", "rollout/truncated_fraction")


def with_metrics(group, rows):
    for sample, row in zip(group.samples, rows, strict=True):
        sample.metadata = {"source": "x", "rollout_metrics": row}
    return group


def per_sample(turns, calls, errors, seconds, truncated):
    return {"turns_mean": turns, "tool_calls_mean": calls, "tool_errors_mean": errors, "tool_seconds_mean": seconds,
            "truncated_fraction": truncated}


def test_the_step_metrics_are_the_means_over_the_kept_samples():
    driver = build("rollout", "rollout", plasmid_rollout.plugin, config=make_config(plasmid_rollout.plugin))
    groups = [with_metrics(make_group([1.0, 0.0]), [per_sample(3, 2, 0, 0.5, 0.0), per_sample(1, 0, 0, 0.0, 0.0)]),
              with_metrics(make_group([0.0, 1.0], index=1), [per_sample(4, 3, 2, 1.5, 1.0),
                                                             per_sample(2, 1, 1, 0.25, 1.0)])]
    metrics = driver._metrics(groups, 2, {}, 0, 1.0)
    assert {name: metrics[name] for name in MULTITURN} == {
        "rollout/turns_mean": 2.5, "rollout/tool_calls_mean": 1.5, "rollout/tool_errors_mean": 0.75,
        "rollout/tool_seconds_mean": pytest.approx(0.5625), "rollout/truncated_fraction": 0.5}


def test_single_turn_samples_add_no_metric_but_their_truncated_fraction():
    driver = build("rollout", "rollout", plasmid_rollout.plugin, config=make_config(plasmid_rollout.plugin))
    plain = driver._metrics([make_group([1.0, 0.0])], 1, {}, 0, 1.0)
    assert set(plain) & set(MULTITURN) == {"rollout/truncated_fraction"}
    assert set(plain) == {"rollout/groups_launched", "rollout/groups_kept", "rollout/groups_aborted",
                          "rollout/seconds_generating", "rollout/reward_mean", "rollout/reward_std",
                          "rollout/response_length_mean", "rollout/response_length_max",
                          "rollout/truncated_fraction", "rollout/tokens_per_second", "rollout/accuracy",
                          "rollout/reward/test", "rollout/reward_out_of_range_fraction"}
    assert sample_metrics(make_group([1.0]).samples) == {}


def test_the_truncated_fraction_of_single_turn_samples_counts_those_cut_at_max_new_tokens():
    from plasmid.types import Status

    driver = build("rollout", "rollout", plasmid_rollout.plugin, config=make_config(plasmid_rollout.plugin))
    groups = [make_group([1.0, 0.0, 0.0]), make_group([0.0], index=1)]
    for sample, status in zip([s for g in groups for s in g.samples],
                              [Status.TRUNCATED, Status.COMPLETED, Status.TRUNCATED, Status.COMPLETED], strict=True):
        sample.status = status
    assert driver._metrics(groups, 2, {}, 0, 1.0)["rollout/truncated_fraction"] == 0.5


def test_rewards_past_the_range_bound_are_a_warning_metric_and_one_line_once(capsys):
    """A finite reward of 1e30 zeroes every other advantage of its group: it must be visible."""
    driver = build("rollout", "rollout", plasmid_rollout.plugin, config=make_config(plasmid_rollout.plugin))
    honest = driver._metrics([make_group([1.0, 0.0, -1000.0, 1000.0])], 1, {}, 0, 1.0)
    assert honest["rollout/reward_out_of_range_fraction"] == 0.0 and capsys.readouterr().err == ""
    groups = [make_group([1e30, 0.0, 1.0, 0.0]), make_group([-2e3, float("nan"), 0.5, 0.5], index=1)]
    assert driver._metrics(groups, 2, {}, 0, 1.0)["rollout/reward_out_of_range_fraction"] == 3 / 8
    warned = capsys.readouterr().err.splitlines()
    assert len(warned) == 1 and "3 of 8 rewards of this step exceed --reward-range-bound 1000" in warned[0]
    driver._metrics(groups, 2, {}, 0, 1.0)
    assert capsys.readouterr().err == "", "the warning line is printed once per run"
    tight = build("rollout", "rollout", plasmid_rollout.plugin,
                  config=make_config(plasmid_rollout.plugin, reward_range_bound=0.75))
    assert tight._metrics([make_group([1.0, 0.0, 0.5, 0.5])], 1, {}, 0, 1.0)[
        "rollout/reward_out_of_range_fraction"] == 0.25


def test_a_name_only_some_samples_carry_is_averaged_over_those():
    group = make_group([1.0, 0.0, 0.0])
    group.samples[0].metadata = {"rollout_metrics": {"turns_mean": 4.0}}
    group.samples[1].metadata = {"rollout_metrics": {"turns_mean": 2.0}}
    assert sample_metrics(group.samples) == {"rollout/turns_mean": 3.0}


def test_a_sample_reset_to_its_prompt_drops_its_metrics():
    group = with_metrics(make_group([1.0]), [per_sample(3, 2, 0, 0.5, 0.0)])
    assert reset_to_prompt(group.samples[0]).metadata == {"source": "x"}


def test_samples_of_a_mixture_add_reward_and_accuracy_per_subset():
    from plasmid_rollout.driver import subset_metrics

    group = make_group([1.0, 0.0, 1.0, 1.0])
    for sample, (subset, exact) in zip(group.samples, [("add", 1.0), ("add", 0.0), ("sort", 1.0), ("sort", 0.5)],
                                       strict=True):
        sample.metadata = {"subset": subset}
        sample.reward_components = {"exact": exact, "format": 1.0}
    assert subset_metrics(group.samples, "rollout/reward", "rollout/accuracy") == {
        "rollout/reward/exact/add": 0.5, "rollout/reward/format/add": 1.0, "rollout/accuracy/add": 0.5,
        "rollout/reward/exact/sort": 0.75, "rollout/reward/format/sort": 1.0, "rollout/accuracy/sort": 0.5}
    plain = make_group([1.0, 0.0])
    assert subset_metrics(plain.samples, "rollout/reward", "rollout/accuracy") == {}
