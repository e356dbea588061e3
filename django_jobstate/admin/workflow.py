"""A step's workflow on its job page: its steps read and placed in stages (workflow_svg.py
draws them).

Two reads, each by an index, whatever the history holds: the workflow's attempts
(jobstate_job_by_workflow) and the dependencies between its steps (the dependency table's
(downstream, upstream) unique index). A step is its task's newest attempt. Stages are
dependency depth: a chain runs left to right, a group stands in one stage; a huge
workflow is drawn in part (MAX_BOXES, PER_STAGE), and the page says how much is left out.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.urls import reverse
from django.utils.translation import gettext_lazy as _

from ..limits.concurrency import Hold
from ..models import Job, JobDependency
from ..states import FailureReason, State

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

    from .jobs import JobAdmin

MAX_BOXES = 200  # drawn at most; the rest is counted
PER_STAGE = 60  # of one stage (a group of 10,000 shows 60 of them and what follows)
READ_LIMIT = 5000  # attempts read at most: past it the count of the rest is read apart

# What a box says of its step, and the class that colours it (admin.css).
LOOKS: dict[str, StrOrPromise] = {
    "succeeded": _("succeeded"),
    "running": _("running"),
    "queued": _("queued"),
    "waiting": _("waiting for its dependencies"),
    "failed": _("failed"),
    "upstream_failed": _("upstream failed"),
    "cancelled": _("cancelled"),
}


@dataclass
class Box:
    """One step: its newest attempt, where it is drawn, what it comes after."""

    result_id: uuid.UUID
    pk: int
    attempt: int
    task_path: str
    look: str  # a key of LOOKS
    first_pk: int  # its first attempt: the order steps were written in
    after: list[uuid.UUID] = field(default_factory=list)  # in the order it receives them
    stage: int = 0
    row: float = 0.0
    number: int = 0  # 1, 2, ... in the order drawn (the table's and the boxes' labels)
    url: str = ""

    @property
    def task_name(self) -> str:
        return self.task_path.rpartition(".")[2]

    @property
    def label(self) -> StrOrPromise:
        return LOOKS[self.look]


@dataclass
class Picture:
    stages: list[list[Box]]  # the boxes drawn, stage by stage
    total: int  # steps in the workflow
    this: uuid.UUID  # the page's step
    edges: list[tuple[Box, Box]]  # (upstream, downstream), both drawn

    @property
    def boxes(self) -> list[Box]:
        return [box for stage in self.stages for box in stage]

    @property
    def left_out(self) -> int:
        return self.total - len(self.boxes)


def look(state: str, reason: str, hold: str | None) -> str:
    if state == State.QUEUED:
        return "waiting" if hold == Hold.DEPS else "queued"
    if state == State.FAILED and reason in (FailureReason.UPSTREAM_FAILED, FailureReason.CANCELLED):
        return str(reason)
    return str(state)


def read_steps(workflow_id: uuid.UUID) -> tuple[dict[uuid.UUID, Box], int]:
    """The workflow's steps by result id (each its newest attempt), and how many it has."""
    columns = ["pk", "result_id", "attempt", "task_path", "state", "failure_reason", "hold"]
    # No ORDER BY: with a LIMIT it could lead a planner to walk the primary key instead.
    rows = list(Job.objects.filter(workflow_id=workflow_id).values_list(*columns)[:READ_LIMIT])
    steps: dict[uuid.UUID, Box] = {}
    for pk, result_id, attempt, task_path, state, reason, hold in sorted(rows):
        first = steps[result_id].first_pk if result_id in steps else pk
        if result_id not in steps or attempt > steps[result_id].attempt:
            box = Box(result_id, pk, attempt, task_path, look(state, reason, hold), first)
            steps[result_id] = box
    total = len(steps)
    if len(rows) == READ_LIMIT:  # a huge workflow: count its steps, by the same index
        total = Job.objects.filter(workflow_id=workflow_id).values("result_id").distinct().count()
    return steps, total


def link_steps(steps: dict[uuid.UUID, Box]) -> None:
    """Set each step's `after`: the steps of this workflow it depends on, in order."""
    edges = JobDependency.objects.filter(downstream__in=list(steps))
    by_position = sorted(edges.values_list("position", "upstream", "downstream"))
    for _position, upstream, downstream in by_position:
        if upstream in steps:  # a depends_on outside the workflow is not drawn
            steps[downstream].after.append(upstream)


def place(steps: dict[uuid.UUID, Box], this: uuid.UUID, total: int) -> Picture:
    """Stages by dependency depth (the longest way from a step that waits for nothing),
    each in the order its upstreams stand in (a group of chains runs in parallel rows)."""
    dependents: dict[uuid.UUID, list[uuid.UUID]] = defaultdict(list)
    waiting = {rid: len(box.after) for rid, box in steps.items()}
    for rid, box in steps.items():
        for upstream in box.after:
            dependents[upstream].append(rid)
    ready = [rid for rid, n in waiting.items() if n == 0]
    while ready:  # Kahn's order: each step once all it comes after is placed
        rid = ready.pop()
        for down in dependents[rid]:
            steps[down].stage = max(steps[down].stage, steps[rid].stage + 1)
            waiting[down] -= 1
            if waiting[down] == 0:
                ready.append(down)
    by_stage: dict[int, list[Box]] = defaultdict(list)
    for box in steps.values():
        by_stage[box.stage].append(box)
    stages: list[list[Box]] = []
    budget = MAX_BOXES
    for depth in sorted(by_stage):
        if budget <= 0:
            break
        drawn = {b.result_id: b for stage in stages for b in stage}
        members = sorted(by_stage[depth], key=lambda b: (_mean_row(b, drawn), b.first_pk))
        shown = members[: min(budget, PER_STAGE)]
        if this in steps and steps[this] in members and steps[this] not in shown:
            shown[-1] = steps[this]  # the page's own step is always drawn
        for row, box in enumerate(shown):
            box.row = row
        stages.append(shown)
        budget -= len(shown)
    picture = Picture(stages, total, this, [])
    drawn = {box.result_id: box for box in picture.boxes}
    for number, box in enumerate(picture.boxes, start=1):
        box.number = number
        picture.edges += [(drawn[u], box) for u in box.after if u in drawn]
    return picture


def _mean_row(box: Box, drawn: dict[uuid.UUID, Box]) -> float:
    rows = [drawn[u].row for u in box.after if u in drawn]
    return sum(rows) / len(rows) if rows else 0.0


def workflow_context(model_admin: JobAdmin, job: Job) -> dict[str, Any]:
    """The job page's workflow section, for a step (empty for any other job)."""
    from .workflow_svg import draw, summary

    if job.workflow_id is None:
        return {}
    steps, total = read_steps(job.workflow_id)
    link_steps(steps)
    picture = place(steps, job.result_id, total)
    opts, site = model_admin.opts, model_admin.admin_site.name
    for box in picture.boxes:
        name = f"admin:{opts.app_label}_{opts.model_name}_change"
        box.url = reverse(name, args=[box.pk], current_app=site)
    # The table's "after steps": by number; one left out of the picture as "…".
    rows = [(box, [steps[u].number or "…" for u in box.after]) for box in picture.boxes]
    return {
        "workflow": picture,
        "workflow_svg": draw(picture),
        "workflow_summary": summary(picture),
        "workflow_rows": rows,
    }
