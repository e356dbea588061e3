"""TaskResults: what Django's Tasks framework sees of a task, built from its attempts' rows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, cast

from .built_on_read import BuiltOnRead
from .loading import load_task
from .states import FailureReason, State
from .task_options import with_settings
from .tasksapi import TASK_REFRESH_ATTRS, Task, TaskError, TaskResult, TaskResultStatus

if TYPE_CHECKING:
    from .models import Job

STATUS = {
    State.QUEUED: TaskResultStatus.READY,
    State.RUNNING: TaskResultStatus.RUNNING,
    State.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    State.FAILED: TaskResultStatus.FAILED,
}

# Failed attempts that are no error of the task: the next attempt does not count them.
NOT_ERRORS = frozenset({FailureReason.RELEASED, FailureReason.SNOOZED})


@dataclass(frozen=True, slots=True, kw_only=True)
class JobStateTaskResult(TaskResult):  # type: ignore[misc]  # frozen at runtime, not in the stubs
    """Django's TaskResult, plus the newest attempt's `metadata` (refresh() reads it too)."""

    metadata: dict[str, Any] = field(default_factory=dict)

    def refresh(self) -> None:
        self._update(self.task.get_backend().get_result(self.id))

    async def arefresh(self) -> None:
        self._update(await self.task.get_backend().aget_result(self.id))

    def _update(self, refreshed: TaskResult) -> None:
        for attr in (*TASK_REFRESH_ATTRS, "metadata"):
            object.__setattr__(self, attr, getattr(refreshed, attr))


def to_task_result(attempts: Sequence[Job], task: Task | None = None) -> TaskResult:
    """Describe one logical task from all its attempts, oldest first."""
    first, newest = attempts[0], attempts[-1]
    if task is None:
        task = with_settings(load_task(newest.task_path))
    task = as_enqueued(task, first, newest)
    started = [a for a in attempts if a.started_at is not None]
    result: TaskResult[Any, Any] = JobStateTaskResult(
        task=task,
        id=str(newest.result_id),
        status=STATUS[State(newest.state)],
        enqueued_at=first.enqueued_at,
        started_at=started[0].started_at if started else None,
        finished_at=newest.finished_at,
        last_attempted_at=started[-1].started_at if started else None,
        args=newest.args,
        kwargs=newest.kwargs,
        backend=newest.backend,
        errors=[
            TaskError(exception_class_path=a.error_class, traceback=a.traceback)
            for a in attempts
            # An attempt released unstarted raised nothing: its task never ran; a snoozed
            # one asked to run again, no error. (One cancelled before it started has an
            # error: JobCancelled, the reason it failed.)
            if a.state == State.FAILED and a.failure_reason not in NOT_ERRORS
        ],
        # The check constraints give every started attempt a worker_id.
        worker_ids=[cast(str, a.worker_id) for a in started],
        metadata=dict(newest.metadata),
    )
    if newest.state == State.SUCCEEDED:
        object.__setattr__(result, "_return_value", newest.return_value)
    return result


def queued_result(task: Task, written: tuple[Any, list[Any], dict[str, Any], Any]) -> TaskResult:
    """to_task_result() of a plain job just enqueued as `task` (Job.objects.enqueue_one()'s
    `written`: result id, arguments as they read back, enqueued_at), without its Job: no
    metadata, the task's own backend (task_options/plan.py).

    Filled in field by field: TaskResult's __post_init__ would normalize arguments that
    are already JSON as read back (a tenth of an enqueue's Python, enqueue_cost.py).
    """
    result_id, args, kwargs, enqueued_at = written
    result = object.__new__(JobStateTaskResult)
    _set_task(result, task)
    _set_id(result, str(result_id))
    _set_status(result, TaskResultStatus.READY)
    _set_enqueued_at(result, enqueued_at)
    _set_args(result, args)
    _set_kwargs(result, kwargs)
    _set_backend(result, task.backend)
    _set_errors(result, [])
    _set_worker_ids(result, [])
    _set_metadata(result, {})
    # What a task just enqueued leaves None (_return_value: None until it succeeds).
    # tests/test_backend.py checks that this sets every field to_task_result() does.
    for unset in _UNSET:
        unset(result, None)
    return result


# Each field's slot setter (JobStateTaskResult is frozen): object.__setattr__() by name
# looks the slot up at every call; queued_result() takes 0.9 µs with these, 1.6 without.
def _setter(name: str) -> Any:
    return getattr(JobStateTaskResult, name).__set__


_set_task, _set_id, _set_status = _setter("task"), _setter("id"), _setter("status")
_set_enqueued_at, _set_args, _set_kwargs = (
    _setter("enqueued_at"),
    _setter("args"),
    _setter("kwargs"),
)
_set_backend, _set_errors = _setter("backend"), _setter("errors")
_set_worker_ids, _set_metadata = _setter("worker_ids"), _setter("metadata")
_UNSET = tuple(map(_setter, ("started_at", "finished_at", "last_attempted_at", "_return_value")))


def as_enqueued(task: Task, first: Job, newest: Job) -> Task:
    """`task` with the options its job was enqueued with (`first` and `newest` of its
    attempts); InvalidTask if the backend refuses them (a row written behind its back)."""
    # A run_after other than the enqueue time was given to .using().
    run_after = None if first.run_after == first.enqueued_at else first.run_after
    stored = (newest.queue_name, newest.priority, newest.backend, run_after)
    if (task.queue_name, task.priority, task.backend, task.run_after) == stored:
        return task
    return replace(
        task,
        queue_name=newest.queue_name,
        priority=newest.priority,
        backend=newest.backend,
        run_after=run_after,
    )


class EnqueuedResults(BuiltOnRead[TaskResult]):
    """bulk_enqueue()'s results: one per call, in the calls' order, each built when first
    read (built_on_read.py): what to_task_result() gives for its job as enqueued."""

    __slots__ = ("_jobs", "_task")

    def __init__(self, jobs: Sequence[Job], task: Task, built: dict[int, TaskResult]) -> None:
        super().__init__(built)
        self._jobs, self._task = jobs, task

    def __len__(self) -> int:
        return len(self._jobs)

    def _build(self, i: int) -> TaskResult:
        return to_task_result([self._jobs[i]], self._task)

    def __reduce__(self) -> tuple[Any, ...]:  # __slots__ alone pickles from protocol 2 only
        return (EnqueuedResults, (self._jobs, self._task, self._built))

    def __repr__(self) -> str:
        return f"<EnqueuedResults: {len(self)} tasks>"
