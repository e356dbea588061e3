"""One attempt, from claimed to its outcome: what the worker runs between its claim and
its write (worker.py), one at a time in its own thread or beside others (inflight.py).

The body runs in the worker's process; the ledger (ledger.py) records that it started,
and when it must stop, before the first line of it runs.
"""

from __future__ import annotations

import functools
import inspect
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import InterfaceError, OperationalError

from ..backend import JobStateBackend, load_task
from ..context import JobStateContext
from ..exceptions import JobCancelled, JobTimeout
from ..managers import writing
from ..managers.claim import Unreadable
from ..models import Job
from ..payload import encode_payload
from ..states import FailureReason
from ..task_options import with_settings
from ..task_results import as_enqueued, to_task_result
from ..tasksapi import InvalidTask, Task, TaskResult, audible, send, task_started
from ..telemetry.logs import job_fields

if TYPE_CHECKING:
    from collections.abc import Callable

    from .ledger import Ledger

logger = logging.getLogger("django_jobstate.worker")

# With --in-flight, how long past its deadline an async task, which the worker cancels
# itself, may take to end before the supervisor stops the whole process (inflight.py).
ASYNC_GRACE = 1.0


def is_async(task: Task) -> bool:
    """Whether `task` can run on an event loop: a coroutine function, and not atomic (an
    atomic body runs in a transaction, which is synchronous)."""
    return inspect.iscoroutinefunction(task.func) and not getattr(task, "atomic", False)


@dataclass
class Outcome:
    job: Job
    started: float  # monotonic
    finished: float
    value: object = None
    error: BaseException | None = None
    reason: FailureReason = FailureReason.ERROR
    written: bool = False  # an atomic task's success, written with its body's writes


class AttemptRunner:
    """The worker's part that runs attempts (a mixin of Worker, which holds the state)."""

    ledger: Ledger
    in_flight: int
    db: str
    tracing: Any
    _tasks: dict[str, Task]
    _average_duration: float | None
    _durations: dict[str, float]  # {task path: its average duration}
    retrying: Callable[[Callable[[], Any]], Any]  # OutcomeWriter's
    # Whether task_started reaches anything that reads its TaskResult (tasksapi.audible),
    # looked up as each claim's attempts begin: a receiver or log handler added meanwhile
    # hears from the next claim on. (task_finished: at each write, recording.py.)
    announce_started = True

    def listen(self) -> None:
        """Look up who hears task_started, for the attempts just claimed."""
        self.announce_started = audible(task_started, JobStateBackend)

    def _execute(self, job: Job, index: int) -> Outcome | None:
        """Run the attempt at `index` of the held batch and return its outcome, or None if
        the supervisor handed it back before it started."""
        begun = self.begin(job, index)
        if not isinstance(begun, tuple):
            return begun
        outcome = self.body(job, *begun, index)
        self.learn(outcome)
        return outcome

    def begin(self, job: Job, index: int) -> tuple[Task, TaskResult | None] | Outcome | None:
        """Start the attempt at `index`: its task and result to run the body with, or its
        outcome if it must not run, or None if the supervisor handed it back."""
        try:
            # The database is read here, before the body begins: an outage now is not the
            # task's error. Wait for the database; the attempt is still in hand.
            try:
                task, result = self._prepare(job)
            except (OperationalError, InterfaceError):
                task, result = self.retrying(functools.partial(self._prepare, job))
        except Exception as exc:  # not a task, or a row that cannot run: nothing ran
            return Outcome(job, time.monotonic(), time.monotonic(), error=exc)
        if self.ledger.cancel_requested(index):  # cancelled while held: never begin it
            cancelled = JobCancelled("it was cancelled before it started")
            return Outcome(job, time.monotonic(), time.monotonic(), error=cancelled)
        grace = ASYNC_GRACE if self.on_loop(task) else 0.0
        if not self.ledger.start(index, job.timeout, grace):  # the deadline starts now
            return None
        return task, result

    def on_loop(self, task: Task) -> bool:
        """Whether the attempt runs on the in-flight event loop (inflight.py)."""
        return self.in_flight > 1 and is_async(task)

    def body(self, job: Job, task: Task, result: TaskResult | None, index: int) -> Outcome:
        """Run the body of a started attempt (in this thread) and return its outcome."""
        span = self.tracing.Attempt(job) if self.tracing else None
        started = time.monotonic()
        try:
            value, written = self._call(job, task, result, index)
        except (Exception, SystemExit, KeyboardInterrupt) as exc:
            outcome = Outcome(job, started, time.monotonic(), error=exc)
        else:
            outcome = Outcome(job, started, time.monotonic(), value=value, written=written)
        finally:
            self.ledger.finish(index)
        return self.judge(outcome, span)

    def judge(self, outcome: Outcome, span: Any) -> Outcome:
        """An outcome that came after the attempt's deadline is a timeout."""
        job, duration = outcome.job, outcome.finished - outcome.started
        if job.timeout is not None and duration > job.timeout and not outcome.written:
            # Returned (or raised) after its deadline, before it was stopped: a late
            # supervisor, or the whole process group was frozen. Late is a timeout either way.
            outcome.value, outcome.reason = None, FailureReason.TIMEOUT
            outcome.error = JobTimeout(
                f"the attempt ran past its timeout of {job.timeout:g} seconds ({duration:.1f} s)"
            )
        if span:
            try:
                span.finish(outcome.error, outcome.reason)
            except Exception:  # a tracer's fault must never keep an outcome from its write
                logger.exception(
                    "Job %s: its tracing span could not be ended",
                    job.pk,
                    extra=job_fields(job, "job.span_failed"),
                )
        return outcome

    def learn(self, outcome: Outcome) -> None:
        """Keep the average duration that sizes the next claim, and the task's own, which
        tells the worker whether to write what it holds before the task's next attempt."""
        duration = outcome.finished - outcome.started
        self._average_duration = _average(self._average_duration, duration)
        path = outcome.job.task_path
        self._durations[path] = _average(self._durations.get(path), duration)

    def _prepare(self, job: Job) -> tuple[Task, TaskResult | None]:
        task = self.task_of(job.task_path)  # a path that is not a Task fails: nothing runs
        unreadable = [v for v in (job.args, job.kwargs, job.metadata) if isinstance(v, Unreadable)]
        if unreadable:  # written behind the app's back (enqueue refuses such values)
            raise InvalidTask(f"Job {job.pk} cannot run: {'; '.join(unreadable)}.")
        if not isinstance(job.args, list) or not isinstance(job.kwargs, dict):
            raise InvalidTask(  # a row written behind the app's back: never guess
                f"Job {job.pk} has args {type(job.args).__name__} and kwargs "
                f"{type(job.kwargs).__name__}; they must be a JSON array and a JSON object."
            )
        if not isinstance(job.metadata, dict):
            raise InvalidTask(
                f"Job {job.pk} has metadata {type(job.metadata).__name__}; it must be a JSON "
                f"object."
            )
        if not task.takes_context and not self.announce_started:
            as_enqueued(task, job, job)  # the options to_task_result() would refuse
            return task, None  # nothing would read a TaskResult: build none
        return task, to_task_result([*self.previous_attempts(job), job], task)

    def _call(
        self, job: Job, task: Task, result: TaskResult | None, index: int
    ) -> tuple[object, bool]:
        """Run the body; return its value, and whether its success is already written.

        An atomic task's body runs in a transaction that also writes its success, fenced
        like every outcome: if the attempt is no longer this worker's (rescued as lost,
        timed out), LostRace rolls back the body's writes with it.
        """
        args = self.arguments(job, task, result, index)
        if not getattr(task, "atomic", False):
            value = task.call(*args, *job.args, **job.kwargs)
            return encode_payload(value, "The task's return value")[0], False
        with writing(job, brief=False):
            value = task.call(*args, *job.args, **job.kwargs)
            value = encode_payload(value, "The task's return value")[0]
            Job.objects.succeed(job, value)
        return value, True

    def arguments(
        self, job: Job, task: Task, result: TaskResult | None, index: int
    ) -> tuple[object, ...]:
        """Send task_started; the arguments the body takes before the job's own."""
        if result is None:  # _prepare(): no context, and nothing hears task_started
            return ()
        send(task_started, JobStateBackend, task_result=result)
        if not task.takes_context:
            return ()
        flag = functools.partial(self.ledger.cancel_requested, index)
        return (
            JobStateContext(task_result=result, metadata=job.metadata, _job=job, cancel_flag=flag),
        )

    def task_of(self, path: str) -> Task:
        if path not in self._tasks:
            self._tasks[path] = with_settings(load_task(path))  # atomic from the setting
        return self._tasks[path]

    def previous_attempts(self, job: Job) -> list[Job]:
        if job.attempt == 1:
            return []
        return list(Job.objects.attempts_of(job.result_id).filter(attempt__lt=job.attempt))


def _average(average: float | None, duration: float) -> float:
    return duration if average is None else 0.8 * average + 0.2 * duration
