"""The run's curves (plasmid.app.curve): a well-formed SVG with one labelled panel per logged quantity,
lines through the data inside their plot areas, legends beside them and never over the data, written
by RunLog as reward_curve.svg."""

from __future__ import annotations

import json
import math
import time
import xml.etree.ElementTree as ET

from plasmid.app.curve import MAX_POINTS, Line, Panel, downsample, nice_ticks, render_entries, render_svg
from plasmid.app.runlog import RunLog

SVG = "{http://www.w3.org/2000/svg}"
REWARD, EVAL = "train reward (mean)", "eval accuracy (greedy)"
ALL_METRICS = {"rollout/reward_mean": 0.5, "train/loss": 0.1, "train/approx_kl": 0.01,
               "rollout/response_length_mean": 12.0, "rollout/tokens_per_second": 3500.0}
YLABELS = ["reward / accuracy", "loss", "KL", "response length (tokens)", "tokens / s"]


def _entries(metrics: dict[str, float], steps: int = 10) -> list[dict]:
    """``steps`` metrics.jsonl objects, each metric varying with the step."""
    return [{"step": step, **{key: value * (1 + step / 10) for key, value in metrics.items()}} for step in range(steps)]


def _box(element: ET.Element) -> tuple[float, float, float, float]:
    left, top = float(element.get("x")), float(element.get("y"))
    return left, top, left + float(element.get("width")), top + float(element.get("height"))


def _panels(text: str) -> list[dict]:
    """Each panel of the SVG: its y label text, plot area, legend box, legend texts and series."""
    root = ET.fromstring(text)
    panels = []
    for group in root.iter(f"{SVG}g"):
        if group.get("class") != "panel":
            continue
        by_class: dict[str, list[ET.Element]] = {}
        for element in group:
            by_class.setdefault(element.get("class", ""), []).append(element)
        (plot,), (legend,), (ylabel,) = by_class["plot"], by_class["legend"], by_class["ylabel"]
        legend_box = _box(legend)
        panels.append({
            "ylabel": ylabel.text, "ylabel_transform": ylabel.get("transform"),
            "plot": _box(plot), "legend": legend_box,
            "legend_texts": [t.text for t in group.iter(f"{SVG}text")
                             if legend_box[0] <= float(t.get("x")) <= legend_box[2]
                             and legend_box[1] <= float(t.get("y")) <= legend_box[3]],
            "series": {line.get("data-name"): [tuple(map(float, xy.split(","))) for xy in line.get("points").split()]
                       for line in group.iter(f"{SVG}polyline")},
            "circles": len(list(group.iter(f"{SVG}circle"))),
            "yticks": [float(t.text) for t in group.iter(f"{SVG}text") if t.get("text-anchor") == "end"],
        })
    return panels


def _overlap(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_every_logged_quantity_gets_a_labelled_panel_in_order():
    panels = _panels(render_entries("run", _entries({**ALL_METRICS, "eval/accuracy": 0.2})))
    assert [p["ylabel"] for p in panels] == YLABELS
    assert all(p["ylabel_transform"].startswith("rotate(-90") for p in panels)    # along the y axis
    assert set(panels[0]["series"]) == {REWARD, EVAL}
    assert [set(p["series"]) for p in panels[1:]] == [{"train/loss"}, {"train/approx_kl"},
                                                      {"response length (mean)"}, {"rollout tokens/s"}]
    # panels are stacked: their plot areas share the x extent and do not overlap
    assert len({(p["plot"][0], p["plot"][2]) for p in panels}) == 1
    assert all(a["plot"][3] < b["plot"][1] for a, b in zip(panels, panels[1:], strict=False))


def test_missing_metrics_give_no_panel_and_no_empty_one():
    only = _panels(render_entries("run", _entries({"rollout/reward_mean": 0.5, "rollout/tokens_per_second": 900.0})))
    assert [p["ylabel"] for p in only] == ["reward / accuracy", "tokens / s"]
    assert set(only[0]["series"]) == {REWARD}                               # no eval logged: no eval line
    assert only[0]["legend_texts"] == [REWARD]
    # a metric logged only as NaN/inf (or not a number) draws nothing: no panel for it
    entries = _entries({"rollout/reward_mean": 0.5})
    for entry in entries:
        entry.update({"train/loss": float("nan"), "train/kl": math.inf, "rollout/response_length_mean": "n/a"})
    panels = _panels(render_entries("run", entries))
    assert [p["ylabel"] for p in panels] == ["reward / accuracy"]
    assert all(p["series"] and all(p["series"].values()) for p in panels)


def test_the_kl_panel_draws_whichever_kl_is_logged():
    for key in ("train/approx_kl", "train/ppo_kl", "train/kl"):
        (panel,) = _panels(render_entries("run", _entries({key: 0.02})))
        assert panel["ylabel"] == "KL" and set(panel["series"]) == {key}
    # several logged: the first of approx_kl, ppo_kl, kl, not three lines of one quantity
    (panel,) = _panels(render_entries("run", _entries({"train/kl": 0.02, "train/ppo_kl": 0.03})))
    assert set(panel["series"]) == {"train/ppo_kl"}


def test_legends_sit_outside_the_plot_areas_and_lines_inside():
    entries = _entries({**ALL_METRICS, "eval/accuracy": 0.2, "rollout/reward_mean": 1.0})  # data up to the top
    root = ET.fromstring(render_entries("a run", entries))
    width, height = float(root.get("width")), float(root.get("height"))
    panels = _panels(render_entries("a run", entries))
    plots = [p["plot"] for p in panels]
    for panel in panels:
        legend = panel["legend"]
        assert legend[2] <= width and legend[3] <= height                   # on the page
        assert not any(_overlap(legend, plot) for plot in plots), (legend, plots)
        assert panel["legend_texts"], "the legend's names are in its box"
        left, top, right, bottom = panel["plot"]
        for points in panel["series"].values():
            assert all(left <= x <= right and top <= y <= bottom for x, y in points)
    # a long legend name widens the page, not the legend into the plot
    long_name = "x" * 80
    svg = render_svg("run", [Panel("loss", [Line(long_name, "#000", [(0, 1.0), (1, 2.0)])])])
    (panel,) = _panels(svg)
    assert panel["legend"][0] >= panel["plot"][2]
    assert panel["legend"][2] - panel["legend"][0] >= 6 * len(long_name)
    assert float(ET.fromstring(svg).get("width")) >= panel["legend"][2]


def test_lines_go_through_the_data_in_order_inside_the_plot_area():
    rewards = [(step, step / 10) for step in range(11)]          # 0 .. 1
    evals = [(0, 0.0), (5, 0.5), (10, 1.0)]
    svg = render_svg("run", [Panel("reward", [Line(REWARD, "#00f", rewards), Line(EVAL, "#f80", evals, True)], "unit")])
    (panel,) = _panels(svg)
    reward_points, eval_points = panel["series"][REWARD], panel["series"][EVAL]
    assert len(reward_points) == 11 and len(eval_points) == 3
    assert panel["circles"] == 3                                  # eval markers only
    xs, ys = zip(*reward_points, strict=True)
    assert list(xs) == sorted(xs) and list(ys) == sorted(ys, reverse=True)   # step right, reward up
    # a linear reward is a straight line: equal steps in x and y
    dx = {round(b[0] - a[0], 1) for a, b in zip(reward_points, reward_points[1:], strict=False)}
    dy = {round(b[1] - a[1], 1) for a, b in zip(reward_points, reward_points[1:], strict=False)}
    assert len(dx) == 1 and len(dy) == 1
    # the eval at step 5 lies on the reward line's step-5 point (same value, same axes)
    assert eval_points[1] == reward_points[5]


def test_panels_share_the_step_axis():
    entries = [{"step": step, "rollout/reward_mean": 0.5, **({"train/loss": 1.0 + step} if step >= 5 else {})}
               for step in range(11)]
    reward, loss = _panels(render_entries("run", entries))
    # the loss starts at step 5: its first point is where the reward's step-5 point is, horizontally
    assert loss["series"]["train/loss"][0][0] == reward["series"][REWARD][5][0]


def test_values_outside_zero_one_stretch_the_axis_and_non_finite_ones_are_left_out():
    rewards = [(0, -2.0), (1, float("nan")), (2, 3.0), (3, math.inf)]
    root = ET.fromstring(render_svg("run", [Panel("reward", [Line(REWARD, "#00f", rewards)], "unit")]))
    (panel,) = _panels(ET.tostring(root, encoding="unicode"))
    points = panel["series"][REWARD]
    assert len(points) == 2
    assert all(panel["plot"][1] <= y <= panel["plot"][3] for _, y in points)
    labels = {text.text for text in root.iter(f"{SVG}text")}
    assert {"-2", "3"} <= labels, labels
    assert EVAL not in labels


def test_flat_and_large_series_get_readable_axes():
    entries = [{"step": step, "train/loss": 0.25, "rollout/tokens_per_second": 120000.0} for step in range(5)]
    loss, throughput = _panels(render_entries("run", entries))
    assert throughput["yticks"][0] == 0 and throughput["yticks"][-1] >= 120000   # throughput from 0
    assert len(throughput["yticks"]) >= 3
    assert loss["yticks"][0] < 0.25 < loss["yticks"][-1] and loss["yticks"][-1] - loss["yticks"][0] < 1
    (points,) = loss["series"].values()
    assert {y for _, y in points} == {points[0][1]}
    assert loss["plot"][1] < points[0][1] < loss["plot"][3]        # a flat line inside the band, not on an edge


def test_the_title_is_escaped_and_an_empty_run_is_still_a_picture():
    root = ET.fromstring(render_entries('a<b & "c"', []))
    assert any(text.text == 'a<b & "c"' for text in root.iter(f"{SVG}text"))
    assert not list(root.iter(f"{SVG}polyline")) and not list(root.iter(f"{SVG}g"))
    assert any(text.text == "no metrics logged yet" for text in root.iter(f"{SVG}text"))


def test_long_series_are_bucket_means_and_a_long_run_draws_fast():
    series = [(step, float(step % 2)) for step in range(10 * MAX_POINTS)]
    drawn = downsample(series)
    assert len(drawn) == MAX_POINTS
    assert all(value == 0.5 for _, value in drawn)
    assert drawn[0][0] == 4.5 and drawn[-1][0] == 10 * MAX_POINTS - 5.5
    assert downsample(series[:10]) == series[:10]
    entries = _entries({**ALL_METRICS, "eval/accuracy": 0.2}, steps=20_000)
    started = time.perf_counter()
    svg = render_entries("run", entries)
    assert time.perf_counter() - started < 3.0      # about 0.05 s on an idle core: catches a quadratic draw
    assert all(len(points) == MAX_POINTS for panel in _panels(svg) for points in panel["series"].values())


def test_nice_ticks_cover_the_range_with_round_steps():
    assert nice_ticks(0, 1) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert nice_ticks(0, 149) == [0, 50, 100, 150]
    ticks = nice_ticks(-2, 3)
    assert ticks[0] <= -2 and ticks[-1] >= 3 and len(ticks) <= 8
    assert nice_ticks(5, 5)[0] <= 5 <= nice_ticks(5, 5)[-1]


def test_runlog_writes_the_curve_of_the_logged_metrics_when_the_run_ends(tmp_path):
    log = RunLog(tmp_path, 3, plot_seconds=1e9)
    for step in range(3):
        log.write(step, {"rollout/reward_mean": step / 2, "train/loss": 1.0 - step / 4, "train/ppo_kl": 0.01,
                         **({"eval/accuracy": 0.25} if step == 2 else {})})
    curve = tmp_path / "reward_curve.svg"
    assert curve.is_file()                          # the last step draws it
    panels = _panels(curve.read_text())
    assert [p["ylabel"] for p in panels] == ["reward / accuracy", "loss", "KL"]
    assert len(panels[0]["series"][REWARD]) == 3 and len(panels[0]["series"][EVAL]) == 1
    # and what it draws is what metrics.jsonl holds
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert _panels(render_entries(tmp_path.name, logged)) == panels
