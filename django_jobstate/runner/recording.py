"""Writing outcomes: successes together in one fenced statement, failures one by one,
each retried until the database takes it (the outcome is known, the database may be
away); an outcome refused because the attempt is no longer this worker's is logged and
discarded. A write the database refuses for good (a constraint, a trigger: an error that
cannot pass) is not retried: its attempt fails with that error. Then the log line and
Django's task_finished signal.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from django.db import DatabaseError, connections
from django.utils import timezone

from ..backend import JobStateBackend
from ..exceptions import LostRace
from ..managers import connection_lost, describe_error
from ..models import Job
from ..states import FailureReason, State
from ..task_options.retries import Next, decide
from ..task_results import to_task_result
from ..tasksapi import Task, audible, send, task_finished
from ..telemetry import metrics
from ..telemetry.logs import job_fields

if TYPE_CHECKING:
    from .attempts import Outcome

logger = logging.getLogger("django_jobstate.worker")
T = TypeVar("T")


class OutcomeWriter:
    """The worker's part that records outcomes (a mixin of Worker)."""

    worker_id: str
    db: str
    task_of: Callable[[str], Task]  # AttemptRunner's
    previous_attempts: Callable[[Job], list[Job]]
    _announce = True  # record()'s: whether a success's task_finished reaches anything

    def record(self, outcomes: list[Outcome]) -> None:
        """Write outcomes, fenced: successes in one statement, failures one by one."""
        self._announce = audible(task_finished, JobStateBackend)  # once a write
        for outcome in outcomes:
            if outcome.written:
                self._finished(outcome)
        successes = [o for o in outcomes if o.error is None and not o.written]
        failures = [o for o in outcomes if o.error is not None]  # before any is refused
        if successes:
            written = self._succeed(successes)
            for outcome in successes:
                if outcome.error is not None:  # its success was refused: failed, logged
                    continue
                if outcome.job.pk in written:
                    outcome.job.state = State.SUCCEEDED
                    outcome.job.return_value = outcome.value
                    outcome.job.finished_at = timezone.now()
                    self._finished(outcome)
                else:
                    self.lost_race(
                        outcome.job,
                        f"it was no longer running for worker {self.worker_id} when moving it "
                        f"to succeeded: another writer got there first. Nothing was changed.",
                    )
        for outcome in failures:
            try:
                decided = self._next(outcome)
                self.retrying(functools.partial(self._fail, outcome, decided))
            except LostRace as exc:
                self.lost_race(outcome.job, str(exc))
            except DatabaseError as exc:  # refused for good (retrying() retries the rest)
                self._refused(outcome, exc, f"its failure as {outcome.reason}")
            else:
                self._finished(outcome)

    def _succeed(self, successes: list[Outcome]) -> set[int]:
        """Write successes in one statement; if the database refuses it for good, each
        alone, and fail an attempt whose success it refuses with that error."""
        pairs = [(o.job, o.value) for o in successes]
        try:
            return self.retrying(lambda: Job.objects.succeed_many(self.worker_id, pairs))
        except DatabaseError:  # not one that can pass: find the attempt it is about
            pass
        written: set[int] = set()
        for outcome in successes:
            write = functools.partial(
                Job.objects.succeed_many, self.worker_id, [(outcome.job, outcome.value)]
            )
            try:
                written |= self.retrying(write)
            except DatabaseError as exc:
                self._refused(outcome, exc, "its success")
        return written

    def _refused(self, outcome: Outcome, refused: DatabaseError, what: str) -> None:
        """The database refused `outcome`'s write for good: fail it with that error (not
        retried), and let it go as written if that write went through."""
        write = functools.partial(Job.objects.fail_refused, outcome.job, refused, what)
        if self.retrying(write):
            outcome.value, outcome.error = None, outcome.error or refused
            self._finished(outcome)
        else:
            outcome.error = outcome.error or refused  # not ours to write any more

    def _next(self, outcome: Outcome) -> Next:
        """The task's retry policy applied to a failed outcome (retries.py); `outcome`
        takes the reason and error to record (SNOOZED, SnoozeLimitReached)."""
        assert outcome.error is not None
        try:
            task: Task | None = self.task_of(outcome.job.task_path)
        except Exception:  # not a task (any more): no policy of its own
            task = None
        snoozed = Job.objects.attempts_of(outcome.job.result_id).filter(
            failure_reason=FailureReason.SNOOZED
        )
        decided = decide(task, outcome.error, outcome.reason, lambda: self.retrying(snoozed.count))
        outcome.reason, outcome.error = decided.reason, decided.error
        return decided

    def _fail(self, outcome: Outcome, decided: Next) -> None:
        Job.objects.fail(
            outcome.job,
            decided.reason,
            retry=decided.retry,
            delay=decided.delay,
            **describe_error(decided.error),
        )

    def retrying(self, write: Callable[[], T]) -> T:
        """Run an outcome write until the database takes it: the outcome is known."""
        delay = 0.5
        while True:
            try:
                return write()
            except DatabaseError as exc:
                if not connection_lost(exc):
                    raise
                logger.warning(
                    "Worker %s: database unavailable; retrying the write in %.1fs",
                    self.worker_id,
                    delay,
                    exc_info=True,
                    extra={"event": "database.unavailable", "worker_id": self.worker_id},
                )
                connections[self.db].close()
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def lost_race(self, job: Job, why: str) -> None:
        logger.warning(
            "Worker %s: outcome of job %s discarded: %s",
            self.worker_id,
            job.pk,
            why,
            extra=job_fields(job, "job.outcome_discarded"),
        )
        if metrics.recorder is not None:
            metrics.recorder.discarded(job)

    def _finished(self, outcome: Outcome) -> None:
        """Log a recorded outcome and send task_finished (inside an exception handler for a
        failure, as Django's backends do, so that its log line carries the traceback)."""
        job, error, took = outcome.job, outcome.error, outcome.finished - outcome.started
        what = (job.pk, job.task_path, job.attempt, job.max_attempts)
        if metrics.recorder is not None:
            metrics.recorder.finished(job, took)
        if error is None:
            if logger.isEnabledFor(logging.INFO):
                logger.info(
                    "Job %s %s attempt %d/%d succeeded in %.3fs",
                    *what,
                    took,
                    extra=job_fields(job, "job.succeeded", duration_ms=round(took * 1000, 3)),
                )
        elif job.failure_reason == FailureReason.SNOOZED:
            # Not finished: its next attempt is queued (no task_finished, not a failure).
            logger.info(
                "Job %s %s attempt %d/%d snoozed after %.3fs: %s",
                *what,
                took,
                error,
                extra=job_fields(job, "job.snoozed", duration_ms=round(took * 1000, 3)),
            )
            return
        else:
            described = describe_error(error)
            reason = job.failure_reason or outcome.reason
            logger.warning(
                "Job %s %s attempt %d/%d failed (%s) in %.3fs: %s: %s",
                *what,
                reason,
                took,
                described["error_class"],
                described["error_message"],
                exc_info=error,
                extra=job_fields(
                    job,
                    "job.failed",
                    duration_ms=round(took * 1000, 3),
                    failure_reason=str(reason),
                    error_class=described["error_class"],
                ),
            )
        if error is None and not self._announce:
            return  # nothing would read its TaskResult (record())
        try:
            result = to_task_result(
                [*self.previous_attempts(job), job], self.task_of(job.task_path)
            )
        except Exception:  # e.g. the task is gone, or the row cannot be a TaskResult
            logger.warning(
                "Job %s: no task_finished signal",
                job.pk,
                exc_info=True,
                extra=job_fields(job, "job.no_signal"),
            )
            return
        try:
            if error is None:
                send(task_finished, JobStateBackend, task_result=result)
                return
            try:
                raise error
            except BaseException:
                send(task_finished, JobStateBackend, task_result=result)
        except Exception:  # a receiver's: the outcome is written, the worker goes on
            logger.exception(
                "Job %s: a task_finished receiver raised",
                job.pk,
                extra=job_fields(job, "job.signal_failed"),
            )
