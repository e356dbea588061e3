"""The test settings' backends: Django's ImmediateBackend and DummyBackend, with the rules
of JobStateBackend, so that a project's test suite fails where production would.

Each enqueue() is checked as JobStateBackend checks it (the queue, the task's options and
JOBSTATE_TASK_OPTIONS', the task module rule, JSON arguments within the size limit, a
unique task's key), and only then run or kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .loading import check_loadable
from .payload import encode_payload
from .task_options import JobStateTask, validate_options, validate_queue, with_settings
from .tasksapi import BaseTaskBackend, Task, TaskResult
from .tasksapi import DummyBackend as DjangoDummyBackend
from .tasksapi import ImmediateBackend as DjangoImmediateBackend
from .uniqueness import is_unique, unique_key


def enforce(
    backend: BaseTaskBackend, task: Task, args: Sequence[Any], kwargs: dict[str, Any]
) -> Task:
    """Raise where JobStateBackend.enqueue() would; return the task as it would enqueue it."""
    task = with_settings(task)
    backend.validate_task(task)
    check_loadable(task)
    encode_payload(list(args), "Task arguments")
    encode_payload(dict(kwargs), "Task keyword arguments")
    if is_unique(task):
        unique_key(task, args, kwargs)  # arguments that do not match the function raise
    return task


class JobStateRules(BaseTaskBackend):
    """What a test backend takes from JobStateBackend: its task class, and its checks."""

    task_class = JobStateTask

    def validate_task(self, task: Task) -> None:
        validate_queue(self, task)
        super().validate_task(task)
        validate_options(task)

    def enqueue(self, task: Task, args: Sequence[Any], kwargs: dict[str, Any]) -> TaskResult:
        return super().enqueue(enforce(self, task, args, kwargs), list(args), kwargs)


class ImmediateBackend(JobStateRules, DjangoImmediateBackend):
    """Runs each task at enqueue(), in the caller's process, as Django's ImmediateBackend
    does, and accepts every task option of JobStateBackend.

    The options are checked as JobStateBackend checks them, then ignored: one attempt, no
    timeout, no transaction of its own (atomic), as in a test that calls the task directly.
    """


class DummyBackend(JobStateRules, DjangoDummyBackend):
    """Runs nothing and keeps each enqueued task's result in `results`, as Django's
    DummyBackend does, and accepts every task option of JobStateBackend (checked as it
    checks them)."""
