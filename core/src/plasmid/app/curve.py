"""The run's curves as an SVG document: one panel per logged quantity against the step.

Written by :class:`plasmid.app.runlog.RunLog` as ``reward_curve.svg`` in the run directory; any
browser, editor preview or notebook (``IPython.display.SVG``) shows it. It is drawn here, with
string formatting only, because that costs a few milliseconds where a plotting library costs
half a second per run (importing matplotlib and rasterising a figure), and it needs no extra
package.

The picture: the run's name as the title, then the panels of :data:`PANELS` stacked over one
shared step axis -- reward (mean training reward, and greedy eval accuracy with markers), loss,
KL, mean response length and rollout tokens per second -- each only when one of its metrics has
a finite value in ``metrics.jsonl`` (no empty panels). Every panel has a y label, "nice" ticks
(1, 2 or 5 times a power of ten) and its legend in a column right of the plot areas, never over
the data. The reward panel's y axis spans at least [0, 1] (rewards and accuracies mostly live
there), length and throughput start at 0, loss and KL span their data; all stretch to any value
outside. A series of more than :data:`MAX_POINTS` points is drawn as that many bucket means (the
file of a 100,000-step run stays small); non-finite values are left out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from html import escape
from itertools import accumulate
from operator import itemgetter
from typing import Any

#: Most points drawn per series; longer series are averaged in equal buckets of steps.
MAX_POINTS = 2000
#: Plot area of one panel (pixels).
PLOT_WIDTH, PLOT_HEIGHT = 600, 180
#: Margins (pixels): left of the plot areas (y label and ticks), above the first panel (title),
#: between panels (tick labels), below the last (tick labels and "step").
LEFT, TOP, GAP, BOTTOM = 76, 40, 44, 44
#: The legend column: its distance from the plot areas, the page's right margin.
LEGEND_GAP, RIGHT = 14, 10
LEGEND_FONT, LEGEND_CHAR, LEGEND_ROW = 11, 6.6, 16  # font size, a generous glyph width, row height
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd")

Series = Sequence[tuple[float, float]]


@dataclass(frozen=True)
class Line:
    """One series of a panel: its legend name, colour and ``(step, value)`` points in step order."""

    name: str
    color: str
    points: Series
    markers: bool = False


@dataclass(frozen=True)
class Panel:
    """One plot: its y label, lines and how its y axis is anchored (``"unit"``: spans at least
    [0, 1]; ``"zero"``: includes 0; ``"data"``: the data's range)."""

    ylabel: str
    lines: Sequence[Line]
    anchor: str = "data"


@dataclass(frozen=True)
class PanelSpec:
    """Which ``metrics.jsonl`` keys make a panel: ``(key, legend name, markers)`` each; with
    ``first_only``, only the first of them that is logged is drawn."""

    ylabel: str
    metrics: tuple[tuple[str, str, bool], ...]
    anchor: str = "data"
    first_only: bool = False


#: The panels, top to bottom, and the metrics each draws.
PANELS = (
    PanelSpec("reward / accuracy", (("rollout/reward_mean", "train reward (mean)", False),
                                    ("eval/accuracy", "eval accuracy (greedy)", True)), anchor="unit"),
    PanelSpec("loss", (("train/loss", "train/loss", False),)),
    PanelSpec("KL", (("train/approx_kl", "train/approx_kl", False), ("train/ppo_kl", "train/ppo_kl", False),
                     ("train/kl", "train/kl", False)), first_only=True),
    PanelSpec("response length (tokens)", (("rollout/response_length_mean", "response length (mean)", False),),
              anchor="zero"),
    PanelSpec("tokens / s", (("rollout/tokens_per_second", "rollout tokens/s", False),), anchor="zero"),
)


def panels_from_entries(entries: Iterable[Mapping[str, Any]]) -> list[Panel]:
    """The :data:`PANELS` that have data in ``entries`` (``metrics.jsonl`` objects, each with a
    ``step``); a metric without one finite value draws nothing, a panel without a line is left out."""
    entries = list(entries)
    panels = []
    for spec in PANELS:
        lines: list[Line] = []
        for key, name, markers in spec.metrics:
            points = [(entry["step"], entry[key]) for entry in entries if key in entry]
            if any(_is_finite(value) for _, value in points):  # render_svg keeps the finite ones
                lines.append(Line(name, COLORS[len(lines) % len(COLORS)], points, markers))
                if spec.first_only:
                    break
        if lines:
            panels.append(Panel(spec.ylabel, lines, spec.anchor))
    return panels


def render_entries(title: str, entries: Iterable[Mapping[str, Any]]) -> str:
    """The SVG text of the curves of ``entries`` (``metrics.jsonl`` objects), see :func:`render_svg`."""
    return render_svg(title, panels_from_entries(entries))


def render_svg(title: str, panels: Sequence[Panel]) -> str:
    """The SVG text of ``panels`` stacked over a shared step axis.

    :param title: shown above the panels (escaped here, as every text is: any text is safe).
    :param panels: drawn top to bottom; lines without a finite point are left out, and so is a
        panel left without lines. No panel at all is a picture saying so.
    """
    panels = [Panel(p.ylabel, kept, p.anchor) for p in panels
              if (kept := [Line(ln.name, ln.color, downsample(points), ln.markers)
                           for ln in p.lines if (points := _finite(ln.points))])]
    steps = [step for panel in panels for line in panel.lines for step, _ in line.points]
    x_ticks = nice_ticks(min(steps), max(steps)) if steps else nice_ticks(0.0, 1.0)
    x_low, x_high = x_ticks[0], x_ticks[-1]
    names = [line.name for panel in panels for line in panel.lines]
    legend_width = 44 + math.ceil(LEGEND_CHAR * max(map(len, names), default=0))
    width = LEFT + PLOT_WIDTH + LEGEND_GAP + legend_width + RIGHT
    count = max(1, len(panels))
    height = TOP + count * PLOT_HEIGHT + (count - 1) * GAP + BOTTOM

    def x(step: float) -> float:
        return LEFT + (step - x_low) / (x_high - x_low) * PLOT_WIDTH

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
             f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<text class="title" x="{width / 2:.1f}" y="24" text-anchor="middle" font-size="14">'
             f'{escape(title)}</text>']
    if not panels:
        parts.append(f'<text x="{LEFT + PLOT_WIDTH / 2:.1f}" y="{TOP + PLOT_HEIGHT / 2:.1f}" '
                     f'text-anchor="middle" fill="#888">no metrics logged yet</text>')
    for index, panel in enumerate(panels):
        top = TOP + index * (PLOT_HEIGHT + GAP)
        parts.extend(_panel(panel, top, x, x_ticks, legend_width))
    parts.append(f'<text class="xlabel" x="{LEFT + PLOT_WIDTH / 2:.1f}" y="{height - 8}" '
                 f'text-anchor="middle">step</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _panel(panel: Panel, top: float, x: Callable[[float], float], x_ticks: list[float], legend_width: int) -> list[str]:
    """The SVG elements of one panel whose plot area starts ``top`` pixels down."""
    values = [value for line in panel.lines for _, value in line.points]
    low, high = min(values), max(values)
    if panel.anchor == "unit":
        low, high = min(low, 0.0), max(high, 1.0)
    elif panel.anchor == "zero":
        low, high = min(low, 0.0), max(high, 0.0)
    if high - low <= 1e-12 * max(1.0, abs(high)):  # a flat line: a band around it, not a 1-wide axis
        pad = abs(high) * 0.1 or 1.0
        low, high = (low, high + pad) if panel.anchor == "zero" else (low - pad, high + pad)
    y_ticks = nice_ticks(low, high)
    y_low, y_high = y_ticks[0], y_ticks[-1]
    bottom, right = top + PLOT_HEIGHT, LEFT + PLOT_WIDTH

    def y(value: float) -> float:
        return top + (y_high - value) / (y_high - y_low) * PLOT_HEIGHT

    parts = [f'<g class="panel" data-ylabel="{escape(panel.ylabel)}">']
    for tick in x_ticks:
        parts.append(f'<line x1="{x(tick):.1f}" y1="{top}" x2="{x(tick):.1f}" y2="{bottom}" stroke="#e5e5e5"/>')
        parts.append(f'<text x="{x(tick):.1f}" y="{bottom + 16}" text-anchor="middle">{_label(tick)}</text>')
    for tick in y_ticks:
        parts.append(f'<line x1="{LEFT}" y1="{y(tick):.1f}" x2="{right}" y2="{y(tick):.1f}" stroke="#e5e5e5"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{y(tick) + 4:.1f}" text-anchor="end">{_label(tick)}</text>')
    parts.append(f'<rect class="plot" x="{LEFT}" y="{top}" width="{PLOT_WIDTH}" height="{PLOT_HEIGHT}" '
                 f'fill="none" stroke="#888"/>')
    middle = top + PLOT_HEIGHT / 2
    parts.append(f'<text class="ylabel" x="16" y="{middle:.1f}" text-anchor="middle" '
                 f'transform="rotate(-90 16 {middle:.1f})">{escape(panel.ylabel)}</text>')
    for line in panel.lines:
        path = " ".join(f"{x(step):.1f},{y(value):.1f}" for step, value in line.points)
        parts.append(f'<polyline class="series" data-name="{escape(line.name)}" fill="none" stroke="{line.color}" '
                     f'stroke-width="1.5" points="{path}"/>')
        if line.markers:
            parts.extend(f'<circle cx="{x(step):.1f}" cy="{y(value):.1f}" r="2.5" fill="{line.color}"/>'
                         for step, value in line.points)
    legend_x = right + LEGEND_GAP
    parts.append(f'<rect class="legend" x="{legend_x}" y="{top}" width="{legend_width}" '
                 f'height="{8 + LEGEND_ROW * len(panel.lines)}" fill="white" stroke="#ccc"/>')
    for row, line in enumerate(panel.lines):
        baseline = top + LEGEND_ROW * (row + 1)
        parts.append(f'<line x1="{legend_x + 8}" y1="{baseline - 4}" x2="{legend_x + 28}" y2="{baseline - 4}" '
                     f'stroke="{line.color}" stroke-width="2"/>')
        parts.append(f'<text x="{legend_x + 34}" y="{baseline}" font-size="{LEGEND_FONT}">'
                     f'{escape(line.name)}</text>')
    parts.append("</g>")
    return parts


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` evenly spaced round values (1, 2 or 5 times a power of ten apart) covering
    ``[low, high]``: the first at or below ``low``, the last at or above ``high``."""
    if high <= low:
        high = low + 1.0
    raw = (high - low) / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first, last = math.floor(low / step + 1e-9), math.ceil(high / step - 1e-9)
    return [round(i * step, 12) for i in range(first, last + 1)]


def downsample(series: Series, limit: int = MAX_POINTS) -> list[tuple[float, float]]:
    """``series`` itself when it has at most ``limit`` points, else ``limit`` bucket means (each
    the mean step and mean value of consecutive points)."""
    if len(series) <= limit:
        return list(series)
    step_sums = list(accumulate(map(itemgetter(0), series), initial=0.0))  # a bucket's sum is a difference
    value_sums = list(accumulate(map(itemgetter(1), series), initial=0.0))
    bounds = [index * len(series) // limit for index in range(limit + 1)]
    return [((step_sums[end] - step_sums[start]) / (end - start), (value_sums[end] - value_sums[start]) / (end - start))
            for start, end in zip(bounds, bounds[1:], strict=False)]


def _finite(series: Series) -> list[tuple[float, float]]:
    """The points of ``series`` whose value is a finite number (not a bool). Written for speed on
    100,000-step series: float points are kept as they are (no new tuple), ``v - v == 0`` is
    false for NaN and infinities, other types take the slow check."""
    return [point if type(point[1]) is float else (point[0], float(point[1])) for point in series
            if (type(point[1]) is float or _is_finite(point[1])) and point[1] - point[1] == 0]


def _is_finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _label(value: float) -> str:
    return f"{value:g}" if abs(value) < 1e6 else f"{value:.3g}"
