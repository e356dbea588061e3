"""A workflow read back: its steps' results, and its status derived from theirs."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from django.db.models import Q

from ..tasksapi import TaskResult, TaskResultDoesNotExist, TaskResultStatus

Status = TaskResultStatus


class WorkflowResult:
    """The steps of one workflow (`.steps`: a TaskResult each, in the order they were
    given) and what follows from them: `.status` FAILED once a step failed for good,
    SUCCESSFUL once every step succeeded, RUNNING once one started, else READY;
    `.return_value`: the result of its last step, or the list of its last steps' (a
    group's). `refresh()` reads them again."""

    def __init__(self, workflow_id: str, result_ids: Sequence[uuid.UUID] | None = None) -> None:
        self.id = workflow_id
        self._order = list(result_ids) if result_ids is not None else None
        self.steps: list[TaskResult] = []
        self._ends: list[str] = []
        self.refresh()

    @classmethod
    def read(cls, workflow_id: str, result_ids: Sequence[uuid.UUID] | None = None) -> Any:
        return cls(workflow_id, result_ids)

    def refresh(self) -> None:
        from ..models import Job, JobDependency
        from ..task_results import to_task_result

        try:
            key = uuid.UUID(str(self.id))
        except ValueError:
            raise TaskResultDoesNotExist(self.id) from None
        attempts: dict[uuid.UUID, list[Job]] = {}
        # By result id too: a unique step's live holder stands in for it (not a step).
        steps = Q(workflow_id=key) | Q(result_id__in=self._order or [])
        for job in Job.objects.filter(steps).order_by("pk"):
            attempts.setdefault(job.result_id, []).append(job)
        if not attempts:
            raise TaskResultDoesNotExist(self.id)
        order = [r for r in self._order or attempts if r in attempts]
        self.steps = [to_task_result(attempts[r]) for r in order]
        # The ends: the steps that nothing in the workflow comes after.
        edges = JobDependency.objects.filter(upstream__in=order, downstream__in=order)
        before = set(edges.values_list("upstream", flat=True))
        self._ends = [str(r) for r in order if r not in before]

    @property
    def status(self) -> TaskResultStatus:
        statuses = [result.status for result in self.steps]
        if Status.FAILED in statuses:
            return Status.FAILED
        if all(s == Status.SUCCESSFUL for s in statuses):
            return Status.SUCCESSFUL
        if any(s in (Status.RUNNING, Status.SUCCESSFUL) for s in statuses):
            return Status.RUNNING
        return Status.READY

    @property
    def is_finished(self) -> bool:
        return self.status in (Status.FAILED, Status.SUCCESSFUL)

    def get_step(self, result_id: str) -> TaskResult:
        for result in self.steps:
            if result.id == str(result_id):
                return result
        raise TaskResultDoesNotExist(result_id)

    @property
    def return_value(self) -> Any:
        """The last step's return value (a list of them after a group); ValueError until
        the workflow succeeded."""
        if self.status != Status.SUCCESSFUL:
            raise ValueError(f"Workflow {self.id} has not succeeded: it is {self.status}.")
        values = [self.get_step(r).return_value for r in self._ends]
        return values[0] if len(values) == 1 else values

    def __repr__(self) -> str:
        return f"<WorkflowResult {self.id} {self.status}: {len(self.steps)} steps>"


def get_workflow(workflow_id: str | uuid.UUID) -> WorkflowResult:
    """Read a workflow back by its id (WorkflowResult.id); TaskResultDoesNotExist if no
    step has it."""
    return WorkflowResult(str(workflow_id))
