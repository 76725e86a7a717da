"""The run's curve as an SVG document: training reward and greedy eval accuracy against the step.

Written by :class:`plasmid.app.runlog.RunLog` as ``reward_curve.svg`` in the run directory; any
browser, editor preview or notebook (``IPython.display.SVG``) shows it. It is drawn here, with
string formatting only, because that costs about a millisecond where a plotting library costs
half a second per run (importing matplotlib and rasterising a figure), and it needs no extra
package.

The picture: one line per series over a shared step axis, "nice" ticks (1, 2 or 5 times a power
of ten) on both axes, the y axis spanning at least [0, 1] (rewards and accuracies mostly live
there) and stretched to any value outside it, a legend, and the run's name as the title. A
series of more than :data:`MAX_POINTS` points is drawn as that many bucket means (the file of a
100,000-step run stays small); non-finite values are left out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

#: Most points drawn per series; longer series are averaged in equal buckets of steps.
MAX_POINTS = 2000
WIDTH, HEIGHT = 720, 400
#: The plot area's margins (pixels): left, right, top, bottom.
LEFT, RIGHT, TOP, BOTTOM = 60, 20, 36, 44
REWARD_COLOR, EVAL_COLOR = "#1f77b4", "#ff7f0e"

Series = Sequence[tuple[float, float]]


def render_svg(title: str, rewards: Series, evals: Series) -> str:
    """The SVG text of the curve.

    :param title: shown above the plot (escaped here: any text is safe).
    :param rewards: ``(step, mean training reward)`` pairs, in step order.
    :param evals: ``(step, greedy eval accuracy)`` pairs, in step order (drawn with markers).
    """
    rewards, evals = _finite(rewards), _finite(evals)
    points = [*rewards, *evals]
    x_low, x_high = (min(p[0] for p in points), max(p[0] for p in points)) if points else (0.0, 1.0)
    y_low = min([0.0, *(p[1] for p in points)])
    y_high = max([1.0, *(p[1] for p in points)])
    x_ticks, y_ticks = nice_ticks(x_low, x_high), nice_ticks(y_low, y_high)
    x_low, x_high, y_low, y_high = x_ticks[0], x_ticks[-1], y_ticks[0], y_ticks[-1]  # the axes end at ticks
    plot_width, plot_height = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(step: float) -> float:
        return LEFT + (step - x_low) / (x_high - x_low) * plot_width

    def y(value: float) -> float:
        return TOP + (y_high - value) / (y_high - y_low) * plot_height

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
             f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">',
             f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
             f'<text x="{WIDTH / 2:.1f}" y="22" text-anchor="middle" font-size="14">{escape(title)}</text>']
    for tick in x_ticks:
        parts.append(f'<line x1="{x(tick):.1f}" y1="{TOP}" x2="{x(tick):.1f}" y2="{TOP + plot_height}" '
                     f'stroke="#e5e5e5"/>')
        parts.append(f'<text x="{x(tick):.1f}" y="{TOP + plot_height + 16}" text-anchor="middle">'
                     f'{_label(tick)}</text>')
    for tick in y_ticks:
        parts.append(f'<line x1="{LEFT}" y1="{y(tick):.1f}" x2="{LEFT + plot_width}" y2="{y(tick):.1f}" '
                     f'stroke="#e5e5e5"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{y(tick) + 4:.1f}" text-anchor="end">{_label(tick)}</text>')
    parts.append(f'<rect x="{LEFT}" y="{TOP}" width="{plot_width}" height="{plot_height}" fill="none" '
                 f'stroke="#888"/>')
    parts.append(f'<text x="{LEFT + plot_width / 2:.1f}" y="{HEIGHT - 8}" text-anchor="middle">step</text>')
    drawn = [("train reward (mean)", REWARD_COLOR, downsample(rewards), False),
             ("eval accuracy (greedy)", EVAL_COLOR, downsample(evals), True)]
    for name, color, series, markers in drawn:
        if not series:
            continue
        path = " ".join(f"{x(step):.1f},{y(value):.1f}" for step, value in series)
        parts.append(f'<polyline class="series" data-name="{name}" fill="none" stroke="{color}" stroke-width="1.5" '
                     f'points="{path}"/>')
        if markers:
            parts.extend(f'<circle cx="{x(step):.1f}" cy="{y(value):.1f}" r="2.5" fill="{color}"/>'
                         for step, value in series)
    legend_y = TOP + 16
    for name, color, series, _ in drawn:
        if series:
            parts.append(f'<line x1="{LEFT + 10}" y1="{legend_y - 4}" x2="{LEFT + 30}" y2="{legend_y - 4}" '
                         f'stroke="{color}" stroke-width="2"/>')
            parts.append(f'<text x="{LEFT + 36}" y="{legend_y}">{name}</text>')
            legend_y += 16
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


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
    buckets: list[tuple[float, float]] = []
    for index in range(limit):
        chunk = series[index * len(series) // limit:(index + 1) * len(series) // limit]
        buckets.append((sum(s for s, _ in chunk) / len(chunk), sum(v for _, v in chunk) / len(chunk)))
    return buckets


def _finite(series: Series) -> list[tuple[float, float]]:
    return [(float(step), float(value)) for step, value in series
            if isinstance(value, (int, float)) and math.isfinite(value)]


def _label(value: float) -> str:
    return f"{value:g}" if abs(value) < 1e6 else f"{value:.3g}"
