"""The test settings' backends: Django's ImmediateBackend and DummyBackend, with the rules
of JobStateBackend, so that a project's test suite fails where production would.

Each enqueue() is checked as JobStateBackend checks it (the queue, the task's options and
JOBSTATE_TASK_OPTIONS', the task module rule, JSON arguments within the size limit, a
unique task's key), and only then run or kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.utils import timezone

from .exceptions import Snooze, class_path, describe_error
from .loading import check_loadable
from .payload import ARGS, KWARGS, encode_payload
from .task_options import JobStateTask, validate_options, validate_queue, with_settings
from .tasksapi import (
    BaseTaskBackend,
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultStatus,
    normalize_json,
    task_enqueued,
    task_finished,
    task_started,
)
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
    encode_payload(list(args), ARGS)
    encode_payload(dict(kwargs), KWARGS)
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

    def bulk_enqueue(
        self, task: Task, calls: Iterable[tuple[Sequence[Any], dict[str, Any]]]
    ) -> list[TaskResult]:
        """JobStateBackend.bulk_enqueue(): every call checked before any is enqueued (all or
        none), then each enqueued (and run, by ImmediateBackend) in order."""
        calls = list(calls)
        for args, kwargs in calls:
            enforce(self, task, args, kwargs)
        return [self.enqueue(task, args, kwargs) for args, kwargs in calls]


class ImmediateBackend(JobStateRules, DjangoImmediateBackend):
    """Runs each task at enqueue(), in the caller's process, as Django's ImmediateBackend
    does, and accepts every task option of JobStateBackend.

    The options are checked as JobStateBackend checks them, then ignored: one attempt, no
    timeout, no transaction of its own (atomic), as in a test that calls the task directly.
    A task that raises Snooze leaves its result READY, with no error and no task_finished,
    as JobStateBackend's result is while the snoozed task waits; nothing runs it later.
    DoNotRetry, or an exception retry_on does not name, is a FAILED result, as any error.
    """

    def _execute_task(self, task_result: TaskResult) -> None:
        # Django's (its signals only, as its own sends), with one more outcome: a snooze.
        # Its own catches every exception and sends task_finished with a FAILED result,
        # which a snooze is not.
        object.__setattr__(task_result, "enqueued_at", timezone.now())
        task_enqueued.send(type(self), task_result=task_result)
        task = task_result.task
        started = timezone.now()
        object.__setattr__(task_result, "status", TaskResultStatus.RUNNING)
        object.__setattr__(task_result, "started_at", started)
        object.__setattr__(task_result, "last_attempted_at", started)
        task_result.worker_ids.append(self.worker_id)
        task_started.send(type(self), task_result=task_result)
        context: tuple[TaskContext, ...] = ()
        if task.takes_context:
            context = (TaskContext(task_result=task_result),)
        try:
            value = task.call(*context, *task_result.args, **task_result.kwargs)
            object.__setattr__(task_result, "_return_value", normalize_json(value))
        except KeyboardInterrupt:
            raise  # the user pressed Ctrl-C, as Django's lets through
        except Snooze:
            object.__setattr__(task_result, "status", TaskResultStatus.READY)
            return
        except BaseException as exc:
            object.__setattr__(task_result, "finished_at", timezone.now())
            error = TaskError(
                exception_class_path=class_path(exc), traceback=describe_error(exc)["traceback"]
            )
            task_result.errors.append(error)
            object.__setattr__(task_result, "status", TaskResultStatus.FAILED)
        else:
            object.__setattr__(task_result, "finished_at", timezone.now())
            object.__setattr__(task_result, "status", TaskResultStatus.SUCCESSFUL)
        task_finished.send(type(self), task_result=task_result)


class DummyBackend(JobStateRules, DjangoDummyBackend):
    """Runs nothing and keeps each enqueued task's result in `results`, as Django's
    DummyBackend does, and accepts every task option of JobStateBackend (checked as it
    checks them)."""
