"""The dashboard's charts, drawn here as inline SVG: no script, font or file from elsewhere.

Each chart is an image with a title and a description (role="img", aria-labelledby), each
bar has its own <title> (a tooltip, and what a screen reader reads), and every text in it
is escaped: queue and task names come from users. Colours are CSS classes (admin.css),
so the admin's dark mode applies; the drawing scales with its box (viewBox, no size).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

WIDTH, HEIGHT = 600, 180  # the viewBox; the page sizes the drawing
LEFT, BOTTOM, TOP = 44, 22, 8  # room for the y axis' labels, the x axis' labels, the top


@dataclass(frozen=True)
class Series:
    key: str  # an outcome, as the bars count it
    label: str
    css: str  # the class that colours it


def _axis_label(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 or value == int(value) else f"{value:.1f}"


def _nice_top(value: float) -> float:
    """The smallest of 1, 2, 5 x 10^n at or above value (at least 1)."""
    top = 1.0
    while top < value:  # steps of 2, 2.5, 2: 1, 2, 5, 10, 20, 50...
        for step in (2, 2.5, 2):
            top *= step
            if top >= value:
                break
    return top


def _frame(
    chart_id: str,
    title: str,
    description: str,
    body: SafeString,
    *,
    size: tuple[int, int] | None = None,
    role: str = "img",
    css: str = "jobstate-chart",
) -> SafeString:
    """The <svg> around `body`: a chart's scales with its box; one given a `size` (the
    workflow's picture) is drawn at most that big (width and height: the page shrinks it)."""
    width, height = size or (WIDTH, HEIGHT)
    sized = format_html(' width="{}" height="{}"', width, height) if size else ""
    return format_html(
        '<svg class="{}" viewBox="0 0 {} {}"{} role="{}" '
        'aria-labelledby="{}-title {}-desc">'
        '<title id="{}-title">{}</title><desc id="{}-desc">{}</desc>{}</svg>',
        css,
        width,
        height,
        sized,
        role,
        chart_id,
        chart_id,
        chart_id,
        title,
        chart_id,
        description,
        body,
    )


def _y_axis(top: float, unit: str) -> SafeString:
    plot = HEIGHT - BOTTOM - TOP
    ticks = [(top * i / 2, TOP + plot - plot * i / 2) for i in range(3)]
    return format_html_join(
        "",
        '<line class="jobstate-grid" x1="{}" x2="{}" y1="{}" y2="{}"/>'
        '<text class="jobstate-axis" x="{}" y="{}" text-anchor="end">{}</text>',
        (
            (LEFT, WIDTH, f"{y:.1f}", f"{y:.1f}", LEFT - 4, f"{y + 4:.1f}", _axis_label(v) + unit)
            for v, y in ticks
        ),
    )


def stacked_bars(
    chart_id: str,
    title: str,
    bars: Sequence[Mapping[str, float]],
    series: Sequence[Series],
    labels: Sequence[str],
    unit: str = "",
    note: str = "",
) -> SafeString:
    """One bar per slot, stacked by series; `labels` names each slot (a few are drawn)."""
    totals = [sum(bar.get(s.key, 0) for s in series) for bar in bars]
    top = _nice_top(max(totals, default=0))
    plot_h, plot_w = HEIGHT - BOTTOM - TOP, WIDTH - LEFT
    step = plot_w / max(1, len(bars))
    parts: list[SafeString] = [_y_axis(top, unit)]
    for index, bar in enumerate(bars):
        y: float = TOP + plot_h
        said = ", ".join(f"{_axis_label(bar[s.key])} {s.label}" for s in series if bar.get(s.key))
        rects = []
        for s in series:
            height = plot_h * bar.get(s.key, 0) / top
            if height > 0:
                y -= height
                rects.append(
                    format_html(
                        '<rect class="{}" x="{}" y="{}" width="{}" height="{}"/>',
                        s.css,
                        f"{LEFT + index * step + step * 0.1:.2f}",
                        f"{y:.2f}",
                        f"{step * 0.8:.2f}",
                        f"{height:.2f}",
                    )
                )
        if rects:
            parts.append(
                format_html(
                    "<g><title>{}: {}</title>{}</g>",
                    labels[index],
                    said,
                    mark_safe("".join(rects)),
                )
            )
    # As many labels as fit: about 7 units of the viewBox per character, with a gap.
    widest = max((len(label) for label in labels), default=1)
    every = max(1, math.ceil((widest + 2) * 7 / step))
    for index in range(0, len(bars), every):
        parts.append(
            format_html(
                '<text class="jobstate-axis" x="{}" y="{}">{}</text>',
                f"{LEFT + index * step:.1f}",
                HEIGHT - 6,
                labels[index],
            )
        )
    described = ", ".join(
        f"{s.label}: {_axis_label(sum(bar.get(s.key, 0) for bar in bars))}" for s in series
    )
    description = f"{len(bars)} bars, {labels[0]} to {labels[-1]}. Totals: {described}.{note}"
    return _frame(chart_id, title, description, mark_safe("".join(parts)))


def histogram(
    chart_id: str,
    title: str,
    counts: Sequence[int],
    bounds: Sequence[float],
    marks: Mapping[str, float | None],
) -> SafeString:
    """Counts per bucket (only the span that has any), with a line at each mark (p50...)."""
    used = [i for i, n in enumerate(counts) if n]
    if not used:
        return _frame(chart_id, title, "No values in this window.", SafeString(""))
    first, last = used[0], used[-1]

    def name(i: int) -> str:  # a bucket by its upper bound
        return f">{_seconds(bounds[-1])}" if i >= len(bounds) else f"<{_seconds(bounds[i])}"

    shown = list(range(first, last + 1))
    bars = [{"n": counts[i]} for i in shown]
    said = "; ".join(f"{label} {_seconds(v)}" for label, v in marks.items() if v is not None)
    series = [Series("n", "attempts", "jobstate-bar")]
    labels = [name(i) for i in shown]
    return stacked_bars(chart_id, title, bars, series, labels, note=f" {said}.")


def _seconds(value: float) -> str:
    if value >= 3600:
        return f"{value / 3600:.3g} h"
    if value >= 60:
        return f"{value / 60:.3g} min"
    if value >= 1 or value == 0:
        return f"{value:.3g} s"
    return f"{value * 1000:.3g} ms"


format_seconds = _seconds
frame = _frame  # the workflow's picture (workflow_svg.py) is framed alike
