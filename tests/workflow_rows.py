"""Workflows built as rows (steps in any state, their dependency edges), for the admin's
picture: each state a step can show, without running workers to reach it."""

import itertools
import uuid
from datetime import timedelta

from django.utils import timezone

from django_jobstate.limits.concurrency import Hold
from django_jobstate.models import Job, JobDependency
from django_jobstate.states import FailureReason, State
from tests.factories import JobFactory

LOOKS = ["succeeded", "running", "failed", "upstream_failed", "cancelled", "waiting", "queued"]


def step_row(workflow_id: uuid.UUID, look: str, **fields: object) -> Job:
    """One step's attempt showing `look` (a key of admin/workflow.py's LOOKS)."""
    fields = {"workflow_id": workflow_id, "task_path": "tests.tasks.record", **fields}
    now = timezone.now()
    if look in ("upstream_failed", "cancelled"):  # failed without starting
        return JobFactory(
            state=State.FAILED,
            failure_reason=look,
            finished_at=now,
            cancel_requested_at=now if look == "cancelled" else None,
            **fields,
        )
    if look == "waiting":
        return JobFactory(hold=Hold.DEPS, pending_deps=1, **fields)
    return JobFactory.in_state(State.QUEUED if look == "queued" else look, **fields)


def edges(pairs: list[tuple[Job, Job]]) -> None:
    """(upstream, downstream) dependencies, each downstream's in the order given."""
    positions: dict[uuid.UUID, int] = {}
    rows = []
    for upstream, downstream in pairs:
        position = positions.get(downstream.result_id, 0)
        positions[downstream.result_id] = position + 1
        rows.append(
            JobDependency(
                upstream=upstream.result_id, downstream=downstream.result_id, position=position
            )
        )
    JobDependency.objects.bulk_create(rows)


def chain(*looks: str) -> list[Job]:
    """Steps one after the other, one per look."""
    workflow_id = uuid.uuid4()
    steps = [
        step_row(workflow_id, look, task_path=f"tests.tasks.step{i}")
        for i, look in enumerate(looks)
    ]
    edges(list(itertools.pairwise(steps)))
    return steps


def chord(size: int, callback: str = "running") -> list[Job]:
    """A group of `size` steps, then a callback after all of them (the last of the list)."""
    workflow_id = uuid.uuid4()
    group = [
        Job(
            result_id=uuid.uuid4(),
            workflow_id=workflow_id,
            task_path="tests.tasks.resize",
            args=[i],
            state=State.SUCCEEDED,
            worker_id="w",
            enqueued_at=timezone.now(),
            run_after=timezone.now(),
            started_at=timezone.now() - timedelta(seconds=1),
            finished_at=timezone.now(),
            has_dependents=True,
        )
        for i in range(size)
    ]
    Job.objects.bulk_create(group)  # read back: MariaDB returns no ids
    group = list(Job.objects.filter(workflow_id=workflow_id).order_by("pk"))
    last = step_row(workflow_id, callback, task_path="tests.tasks.publish")
    edges([(step, last) for step in group])
    return [*group, last]


def retried(step: Job) -> Job:
    """A next attempt of a failed step, queued."""
    assert step.state == State.FAILED
    assert step.failure_reason == FailureReason.ERROR
    return JobFactory(
        result_id=step.result_id,
        attempt=step.attempt + 1,
        previous_id=step.pk,
        workflow_id=step.workflow_id,
        task_path=step.task_path,
    )
