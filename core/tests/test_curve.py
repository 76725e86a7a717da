"""The run's curve (plasmid.app.curve): a well-formed SVG whose lines go through the data, written by
RunLog as reward_curve.svg."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

from plasmid.app.curve import HEIGHT, LEFT, MAX_POINTS, RIGHT, TOP, WIDTH, downsample, nice_ticks, render_svg
from plasmid.app.runlog import RunLog

SVG = "{http://www.w3.org/2000/svg}"


def _parsed(text: str) -> ET.Element:
    return ET.fromstring(text)


def _series(root: ET.Element) -> dict[str, list[tuple[float, float]]]:
    return {line.get("data-name"): [tuple(map(float, pair.split(","))) for pair in line.get("points").split()]
            for line in root.iter(f"{SVG}polyline")}


def test_lines_go_through_the_data_in_order_inside_the_plot_area():
    rewards = [(step, step / 10) for step in range(11)]          # 0 .. 1
    evals = [(0, 0.0), (5, 0.5), (10, 1.0)]
    root = _parsed(render_svg("run", rewards, evals))
    series = _series(root)
    reward_points, eval_points = series["train reward (mean)"], series["eval accuracy (greedy)"]
    assert len(reward_points) == 11 and len(eval_points) == 3
    assert len(list(root.iter(f"{SVG}circle"))) == 3               # eval markers only
    xs, ys = zip(*reward_points, strict=True)
    assert list(xs) == sorted(xs) and list(ys) == sorted(ys, reverse=True)   # step right, reward up
    assert all(LEFT <= x <= WIDTH - RIGHT and TOP <= y <= HEIGHT for x, y in reward_points)
    # a linear reward is a straight line: equal steps in x and y
    dx = {round(b[0] - a[0], 1) for a, b in zip(reward_points, reward_points[1:], strict=False)}
    dy = {round(b[1] - a[1], 1) for a, b in zip(reward_points, reward_points[1:], strict=False)}
    assert len(dx) == 1 and len(dy) == 1
    # the eval at step 5 lies on the reward line's step-5 point (same value, same axes)
    assert eval_points[1] == reward_points[5]


def test_values_outside_zero_one_stretch_the_axis_and_non_finite_ones_are_left_out():
    rewards = [(0, -2.0), (1, float("nan")), (2, 3.0), (3, math.inf)]
    root = _parsed(render_svg("run", rewards, []))
    points = _series(root)["train reward (mean)"]
    assert len(points) == 2
    assert all(TOP <= y <= HEIGHT for _, y in points)
    labels = {text.text for text in root.iter(f"{SVG}text")}
    assert {"-2", "3"} <= labels, labels
    assert "eval accuracy (greedy)" not in labels                   # no eval: no legend entry


def test_the_title_is_escaped_and_an_empty_run_is_still_a_picture():
    root = _parsed(render_svg('a<b & "c"', [], []))
    assert any(text.text == 'a<b & "c"' for text in root.iter(f"{SVG}text"))
    assert not list(root.iter(f"{SVG}polyline"))


def test_long_series_are_bucket_means():
    series = [(step, float(step % 2)) for step in range(10 * MAX_POINTS)]
    drawn = downsample(series)
    assert len(drawn) == MAX_POINTS
    assert all(value == 0.5 for _, value in drawn)
    assert drawn[0][0] == 4.5 and drawn[-1][0] == 10 * MAX_POINTS - 5.5
    assert downsample(series[:10]) == series[:10]


def test_nice_ticks_cover_the_range_with_round_steps():
    assert nice_ticks(0, 1) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert nice_ticks(0, 149) == [0, 50, 100, 150]
    ticks = nice_ticks(-2, 3)
    assert ticks[0] <= -2 and ticks[-1] >= 3 and len(ticks) <= 8
    assert nice_ticks(5, 5)[0] <= 5 <= nice_ticks(5, 5)[-1]


def test_runlog_writes_the_curve_when_the_run_ends(tmp_path):
    log = RunLog(tmp_path, 3, plot_seconds=1e9)
    for step in range(3):
        log.write(step, {"rollout/reward_mean": step / 2, **({"eval/accuracy": 0.25} if step == 2 else {})})
    curve = tmp_path / "reward_curve.svg"
    assert curve.is_file()                          # the last step draws it
    series = _series(_parsed(curve.read_text()))
    assert len(series["train reward (mean)"]) == 3 and len(series["eval accuracy (greedy)"]) == 1
