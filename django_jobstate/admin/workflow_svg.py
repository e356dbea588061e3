"""A workflow's picture as inline SVG, framed as the Dashboard's charts are (charts.py):
no script, font or file from elsewhere, every text escaped (task paths come from users),
colours from CSS classes (admin.css), so the admin's dark mode applies.

Stages stand left to right; a stage of more than ROWS steps (a chord's group) wraps into
columns of ROWS. Each box is a link to its step's page, with its own <title> (a tooltip,
and the link's name for a screen reader); the page's table says the same in text.
"""

from __future__ import annotations

import math
from collections import Counter

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import Truncator
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from .charts import frame
from .workflow import LOOKS, Box, Picture

BOX_W, BOX_H = 150, 38
ROW_GAP, COL_GAP, STAGE_GAP, PAD = 8, 12, 44, 6
ROWS = 10  # boxes in a column before a stage wraps
CHARS = 22  # of a task's name in a box (its whole path is in the tooltip)


def positions(picture: Picture) -> tuple[dict[int, tuple[float, float]], int, int]:
    """Each box's top left corner (by its number), and the drawing's width and height."""
    tallest = max((min(len(stage), ROWS) for stage in picture.stages), default=1)
    height = tallest * (BOX_H + ROW_GAP) - ROW_GAP + 2 * PAD
    at: dict[int, tuple[float, float]] = {}
    x = PAD
    for stage in picture.stages:
        rows = min(len(stage), ROWS)
        top = PAD + (tallest - rows) * (BOX_H + ROW_GAP) / 2  # centred: a chain in one line
        for i, box in enumerate(stage):
            column, row = divmod(i, ROWS)
            at[box.number] = (x + column * (BOX_W + COL_GAP), top + row * (BOX_H + ROW_GAP))
        x += math.ceil(len(stage) / ROWS) * (BOX_W + COL_GAP) - COL_GAP + STAGE_GAP
    return at, int(x - STAGE_GAP + PAD), int(height)


def _arrows(picture: Picture, at: dict[int, tuple[float, float]]) -> SafeString:
    def path(upstream: Box, downstream: Box) -> str:
        (x1, y1), (x2, y2) = at[upstream.number], at[downstream.number]
        x1, y1, y2 = x1 + BOX_W, y1 + BOX_H / 2, y2 + BOX_H / 2
        bend = max(16.0, (x2 - x1) / 2)
        curve = f"{x1 + bend:.0f},{y1:.0f} {x2 - bend:.0f},{y2:.0f} {x2:.0f},{y2:.0f}"
        return f"M{x1:.0f},{y1:.0f} C{curve}"

    return format_html_join(
        "",
        '<path class="jobstate-wf-arrow" d="{}" marker-end="url(#jobstate-wf-head)"/>',
        ((path(up, down),) for up, down in picture.edges),
    )


def _box(picture: Picture, box: Box, x: float, y: float) -> SafeString:
    this = box.result_id == picture.this
    tooltip = _("Step %(n)d: %(task)s, %(state)s (attempt %(attempt)d)") % {
        "n": box.number,
        "task": box.task_path,
        "state": box.label,
        "attempt": box.attempt,
    }
    if this:
        tooltip = _("%(step)s; this page") % {"step": tooltip}
    return format_html(
        '<a href="{}" class="jobstate-wf jobstate-wf-{}{}"{}><title>{}</title>'
        '<rect x="{}" y="{}" width="{}" height="{}" rx="4"/>'
        '<text x="{}" y="{}">{}. {}</text><text class="jobstate-wf-state" x="{}" y="{}">{}</text>'
        "</a>",
        box.url,
        box.look,
        " jobstate-wf-this" if this else "",
        mark_safe(' aria-current="page"') if this else "",
        tooltip,
        f"{x:.0f}",
        f"{y:.0f}",
        BOX_W,
        BOX_H,
        f"{x + 7:.0f}",
        f"{y + 15:.0f}",
        box.number,
        Truncator(box.task_name).chars(CHARS),
        f"{x + 7:.0f}",
        f"{y + 30:.0f}",
        box.label,
    )


def summary(picture: Picture) -> str:
    """'51 steps: 50 succeeded, 1 running.', and what is not drawn."""
    counts = Counter(box.look for box in picture.boxes)
    said = ", ".join(f"{counts[key]} {label}" for key, label in LOOKS.items() if counts[key])
    text = ngettext("%(n)d step", "%(n)d steps", picture.total) % {"n": picture.total}
    text = f"{text}: {said}." if picture.left_out == 0 else f"{text}."
    if picture.left_out:
        text += " " + ngettext(
            "%(shown)d are drawn (%(said)s); %(n)d more is left out.",
            "%(shown)d are drawn (%(said)s); %(n)d more are left out.",
            picture.left_out,
        ) % {"shown": len(picture.boxes), "said": said, "n": picture.left_out}
    return text


def draw(picture: Picture) -> SafeString:
    at, width, height = positions(picture)
    head = (
        '<defs><marker id="jobstate-wf-head" viewBox="0 0 8 8" refX="8" refY="4" '
        'markerWidth="7" markerHeight="7" orient="auto">'
        '<path class="jobstate-wf-head" d="M0,0 L8,4 L0,8 z"/></marker></defs>'
    )
    boxes = mark_safe("".join(_box(picture, box, *at[box.number]) for box in picture.boxes))
    body = mark_safe(head + _arrows(picture, at) + boxes)
    description = _(
        "%(summary)s Stages run left to right: an arrow leads from a step to each step that "
        "waits for it. Each box links to its step's page; the table below lists them."
    ) % {"summary": summary(picture)}
    return frame(
        "jobstate-workflow",
        _("The workflow of this step"),
        description,
        body,
        size=(width, height),
        role="group",
        css="jobstate-workflow-picture",
    )
